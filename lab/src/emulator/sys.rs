//! Thin, checked wrappers over the Linux calls the emulator needs: network namespaces,
//! TAP devices, timerfd, epoll, clocks. Each returns an `io::Error` with context the caller
//! extends with the link and namespace names.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// Where `ip netns add NAME` puts its handle.
pub fn netns_path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

pub fn netns_exists(name: &str) -> bool {
    netns_path(name).exists()
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_isize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Moves the **calling thread** into the named network namespace. Sockets and TAP
/// devices opened afterwards by this thread belong to it.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let f = File::open(netns_path(name))?;
    enter_netns_fd(f.as_raw_fd())
}

pub fn enter_netns_fd(fd: RawFd) -> io::Result<()> {
    // SAFETY: setns on a valid fd; affects only the calling thread.
    cvt(unsafe { libc::setns(fd, libc::CLONE_NEWNET) }).map(|_| ())
}

/// A handle on the calling thread's current network namespace, to return to it later.
pub fn current_netns() -> io::Result<File> {
    File::open("/proc/thread-self/ns/net")
}

/// Runs `f` on a new thread inside namespace `ns` and returns its result.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || -> io::Result<T> {
        enter_netns(&ns)?;
        Ok(f())
    })
    .join()
    .map_err(|_| io::Error::other("thread in netns panicked"))?
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Attaches to (or creates, non-persistently) TAP device `name` in the calling thread's
/// namespace, non-blocking, without packet-information header.
pub fn open_tap(name: &str) -> io::Result<OwnedFd> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name:?} must be 1..15 characters"),
        ));
    }
    let path = CString::new("/dev/net/tun").unwrap();
    // SAFETY: plain open(2).
    let fd = cvt(unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: fd was just returned by open.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI,
        _pad: [0; 22],
    };
    for (d, s) in req.name.iter_mut().zip(name.bytes()) {
        *d = s as libc::c_char;
    }
    // SAFETY: TUNSETIFF reads/writes an ifreq we own.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req) })?;
    Ok(fd)
}

pub fn read(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    cvt_isize(unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) })
}

pub fn write(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for buf.len() bytes.
    cvt_isize(unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) })
}

/// `CLOCK_MONOTONIC` in nanoseconds (vDSO, no syscall).
#[inline]
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in nanoseconds (the clock of `SO_TIMESTAMPNS`).
#[inline]
pub fn realtime_ns() -> u64 {
    clock_ns(libc::CLOCK_REALTIME)
}

#[inline]
fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid timespec out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A `CLOCK_MONOTONIC` timerfd armed with absolute deadlines (sub-millisecond precision,
/// unlike epoll timeouts which round up to 1 ms).
pub struct TimerFd {
    fd: OwnedFd,
    armed: Option<u64>,
}

impl TimerFd {
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain timerfd_create.
        let fd = cvt(unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        })?;
        Ok(Self {
            // SAFETY: fd was just created.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            armed: None,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Arms for absolute time `at` (ns, CLOCK_MONOTONIC); `None` disarms. No syscall if
    /// the deadline is unchanged.
    pub fn arm(&mut self, at: Option<u64>) -> io::Result<()> {
        if self.armed == at {
            return Ok(());
        }
        let ts = |ns: u64| libc::timespec {
            tv_sec: (ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        let spec = libc::itimerspec {
            it_interval: ts(0),
            // A zero it_value would disarm; an already-passed deadline fires at once.
            it_value: ts(at.map(|t| t.max(1)).unwrap_or(0)),
        };
        // SAFETY: valid itimerspec; old value not requested.
        cvt(unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        })?;
        self.armed = at;
        Ok(())
    }

    /// Clears the readiness after it fired.
    pub fn ack(&mut self) {
        let mut buf = [0u8; 8];
        if read(self.fd.as_raw_fd(), &mut buf).is_ok() {
            self.armed = None;
        }
    }
}

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain epoll_create1.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Self {
            // SAFETY: fd was just created.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub fn add(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: valid event struct.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })
            .map(|_| ())
    }

    pub fn delete(&self, fd: RawFd) {
        // SAFETY: removing an fd; errors (already closed) are irrelevant.
        unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        };
    }

    /// Waits; `block == false` only polls. Returns the tokens that are ready.
    pub fn wait(&self, events: &mut [libc::epoll_event], block: bool) -> io::Result<usize> {
        loop {
            // SAFETY: events buffer valid for its length.
            let r = unsafe {
                libc::epoll_wait(
                    self.fd.as_raw_fd(),
                    events.as_mut_ptr(),
                    events.len() as libc::c_int,
                    if block { -1 } else { 0 },
                )
            };
            match cvt(r) {
                Ok(n) => return Ok(n as usize),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// Blocks SIGTERM, SIGINT and SIGHUP for this thread and returns a signalfd for them, so
/// the event loop can exit cleanly.
pub fn termination_signalfd() -> io::Result<OwnedFd> {
    // SAFETY: sigset manipulation on a local set, then sigprocmask/signalfd.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGHUP);
        cvt(libc::pthread_sigmask(
            libc::SIG_BLOCK,
            &set,
            std::ptr::null_mut(),
        ))?;
        let fd = cvt(libc::signalfd(
            -1,
            &set,
            libc::SFD_NONBLOCK | libc::SFD_CLOEXEC,
        ))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Best effort: real-time FIFO scheduling for the calling thread, so release times hold
/// while other processes compete for the CPU. Kernel RT throttling still leaves 5 %.
pub fn set_realtime(priority: i32) -> io::Result<()> {
    let p = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: valid sched_param for the calling thread (tid 0).
    cvt(unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) }).map(|_| ())
}

/// Timer slack of 1 ns for the calling thread (default is 50 µs for normal threads).
pub fn set_min_timer_slack() {
    // SAFETY: prctl with integer arguments.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
}

/// CPU time (user + system) of a process in nanoseconds, from /proc/PID/stat.
pub fn process_cpu_ns(pid: u32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat
        .rfind(')')
        .map(|i| &stat[i + 2..])
        .ok_or_else(|| io::Error::other("malformed /proc stat"))?;
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields after "(comm) ": state=0 … utime=11, stime=12 (stat fields 14 and 15).
    let ticks: u64 = f
        .get(11)
        .and_then(|u| u.parse::<u64>().ok())
        .zip(f.get(12).and_then(|s| s.parse::<u64>().ok()))
        .map(|(u, s)| u + s)
        .ok_or_else(|| io::Error::other("malformed /proc stat"))?;
    // SAFETY: sysconf is always safe.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Ok(ticks * 1_000_000_000 / hz)
}

/// State letter of a process (`R`, `S`, `Z`, …), `None` if it does not exist.
pub fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rfind(')').and_then(|i| stat[i + 2..].chars().next())
}

/// Command line of a process, arguments separated by spaces.
pub fn process_cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect(),
    )
}
