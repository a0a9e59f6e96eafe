//! Real traffic for the emulator's accuracy tests and its benchmark: UDP senders and
//! receivers running on threads that entered a namespace with `setns`, plus guards that
//! remove the namespaces and links a test created (by recorded name, nothing else).
//!
//! Datagram format: `seq: u64 LE`, `sent_ns: u64 LE` (`CLOCK_REALTIME`), then filler.
//! Receivers use the kernel's `SO_TIMESTAMPNS` receive timestamp (also `CLOCK_REALTIME`,
//! taken when the forwarder's write hands the frame to the stack), so one-way delay
//! samples don't include the receiver thread's scheduling latency.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::link::{LinkRecord, LinkSpec, create_link, destroy_link};
use super::sys;

/// A network namespace this process created; deleted on drop.
pub struct NetnsGuard {
    pub name: String,
}

impl NetnsGuard {
    pub fn create(name: &str) -> Result<Self> {
        if sys::netns_exists(name) {
            bail!("namespace {name} already exists; refusing to take it over");
        }
        let out = Command::new("ip")
            .args(["netns", "add", name])
            .stdin(Stdio::null())
            .output()
            .context("running ip netns add")?;
        if !out.status.success() {
            bail!(
                "ip netns add {name}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        // Loopback up: tools like tcpdump and local sockets expect it.
        let _ = Command::new("ip")
            .args(["-n", name, "link", "set", "lo", "up"])
            .status();
        Ok(Self {
            name: name.to_string(),
        })
    }
}

impl Drop for NetnsGuard {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// A link this process created; destroyed (forwarder stopped by PID, TAPs deleted) on drop.
pub struct LinkGuard {
    pub rec: LinkRecord,
}

impl LinkGuard {
    pub fn create(spec: &LinkSpec, exe: &Path) -> Result<Self> {
        Ok(Self {
            rec: create_link(spec, exe)?,
        })
    }
}

impl Drop for LinkGuard {
    fn drop(&mut self) {
        if let Err(e) = destroy_link(&self.rec) {
            eprintln!("cleanup: {e:#}");
        }
    }
}

/// One received datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub seq: u64,
    pub sent_ns: u64,
    pub recv_ns: u64,
    pub len: u32,
}

impl Sample {
    pub fn delay_ns(&self) -> i64 {
        self.recv_ns as i64 - self.sent_ns as i64
    }
}

pub fn set_sock_int(fd: i32, level: i32, opt: i32, val: i32) -> io::Result<()> {
    // SAFETY: setsockopt with a valid int.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            (&val as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A UDP receiver on its own thread inside a namespace.
pub struct UdpReceiver {
    handle: JoinHandle<io::Result<Vec<Sample>>>,
    count: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl UdpReceiver {
    /// Binds in `ns` and returns once the socket is bound (so nothing sent afterwards is
    /// missed). With `record == false` only counts (for the benchmark).
    pub fn start(ns: &str, bind: SocketAddrV4, record: bool) -> Result<Self> {
        let count = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<io::Result<()>>();
        let (c, b, s, ns2) = (count.clone(), bytes.clone(), stop.clone(), ns.to_string());
        let handle = std::thread::spawn(move || -> io::Result<Vec<Sample>> {
            let setup = || -> io::Result<UdpSocket> {
                sys::enter_netns(&ns2)?;
                let sock = UdpSocket::bind(bind)?;
                let fd = sock.as_raw_fd();
                // Room for bursts: the test measures the link, not the socket buffer.
                set_sock_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20)?;
                set_sock_int(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1)?;
                sock.set_read_timeout(Some(Duration::from_millis(10)))?;
                Ok(sock)
            };
            let sock = match setup() {
                Ok(s) => {
                    let _ = ready_tx.send(Ok(()));
                    s
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(io::Error::new(e.kind(), e.to_string())));
                    return Err(e);
                }
            };
            recv_loop(&sock, record, &c, &b, &s)
        });
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Self {
                handle,
                count,
                bytes,
                stop,
            }),
            Ok(Err(e)) => {
                Err(anyhow::Error::new(e).context(format!("receiver in namespace {ns} on {bind}")))
            }
            Err(_) => bail!("receiver in namespace {ns} on {bind}: did not start"),
        }
    }

    pub fn received(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn received_bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Like [`finish`](Self::finish) but returns only the count (for unrecorded receivers).
    pub fn finish_count(self, expected: u64, timeout: Duration) -> Result<u64> {
        let count = self.count.clone();
        self.finish(expected, timeout)?;
        Ok(count.load(Ordering::Relaxed))
    }

    /// Waits until `expected` datagrams arrived (or `timeout`), stops, returns the samples.
    pub fn finish(self, expected: u64, timeout: Duration) -> Result<Vec<Sample>> {
        let deadline = Instant::now() + timeout;
        while self.received() < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        self.stop.store(true, Ordering::Relaxed);
        let v = self
            .handle
            .join()
            .map_err(|_| anyhow::anyhow!("receiver thread panicked"))??;
        Ok(v)
    }
}

fn recv_loop(
    sock: &UdpSocket,
    record: bool,
    count: &AtomicU64,
    bytes: &AtomicU64,
    stop: &AtomicBool,
) -> io::Result<Vec<Sample>> {
    let fd = sock.as_raw_fd();
    if !record {
        return count_loop(fd, count, bytes, stop);
    }
    let mut samples = Vec::with_capacity(1 << 20);
    let mut buf = [0u8; 2048];
    let mut cbuf = [0u64; 16];
    while !stop.load(Ordering::Relaxed) {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: zeroed msghdr is valid; we set the pointers below.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = size_of::<[u64; 16]>() as _;
        // SAFETY: msg points at live buffers.
        let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        let n = n as usize;
        count.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(n as u64, Ordering::Relaxed);
        if !record || n < 16 {
            continue;
        }
        let mut recv_ns = 0;
        // SAFETY: walking the control messages the kernel wrote into cbuf.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    recv_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if recv_ns == 0 {
            recv_ns = sys::realtime_ns();
        }
        samples.push(Sample {
            seq: u64::from_le_bytes(buf[0..8].try_into().unwrap()),
            sent_ns: u64::from_le_bytes(buf[8..16].try_into().unwrap()),
            recv_ns,
            len: n as u32,
        });
    }
    Ok(samples)
}

/// Counting only, 32 datagrams per `recvmmsg`: keeps the benchmark's receivers cheap.
fn count_loop(
    fd: i32,
    count: &AtomicU64,
    bytes: &AtomicU64,
    stop: &AtomicBool,
) -> io::Result<Vec<Sample>> {
    const N: usize = 32;
    let mut bufs = vec![[0u8; 2048]; N];
    while !stop.load(Ordering::Relaxed) {
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec {
                iov_base: b.as_mut_ptr().cast(),
                iov_len: b.len(),
            })
            .collect();
        // SAFETY: zeroed mmsghdr is valid; iov pointers set below.
        let mut msgs: [libc::mmsghdr; N] = unsafe { zeroed() };
        for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
            m.msg_hdr.msg_iov = iov;
            m.msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: msgs point at live buffers; SO_RCVTIMEO bounds the wait.
        let n = unsafe {
            libc::recvmmsg(
                fd,
                msgs.as_mut_ptr(),
                N as u32,
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => continue,
                _ => return Err(e),
            }
        }
        let total: u64 = msgs[..n as usize].iter().map(|m| m.msg_len as u64).sum();
        count.fetch_add(n as u64, Ordering::Relaxed);
        bytes.fetch_add(total, Ordering::Relaxed);
    }
    Ok(Vec::new())
}

/// How a sender sends.
#[derive(Clone, Debug)]
pub struct SendPlan {
    /// Datagrams to send (the sender stops at `count` or `duration`, whichever is first).
    pub count: u64,
    pub duration: Option<Duration>,
    /// UDP payload bytes (at least 16).
    pub payload: usize,
    /// Datagrams per second; 0 = as fast as possible.
    pub pps: f64,
    /// Datagrams per `sendmmsg` call.
    pub batch: usize,
    /// SCHED_FIFO for the sending thread (keeps timestamps close to the actual send).
    pub realtime: bool,
}

impl Default for SendPlan {
    fn default() -> Self {
        Self {
            count: 1000,
            duration: None,
            payload: 64,
            pps: 1000.0,
            batch: 1,
            realtime: false,
        }
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct SendStats {
    pub sent: u64,
    pub elapsed_ns: u64,
}

/// Starts a sender thread in `ns`; join the handle for its stats.
pub fn spawn_sender(
    ns: &str,
    bind: SocketAddrV4,
    dst: SocketAddrV4,
    plan: SendPlan,
) -> JoinHandle<io::Result<SendStats>> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        sys::enter_netns(&ns)?;
        if plan.realtime {
            sys::set_realtime(5)?;
        }
        sys::set_min_timer_slack();
        let sock = UdpSocket::bind(bind)?;
        sock.connect(dst)?;
        set_sock_int(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            8 << 20,
        )?;
        send_loop(&sock, &plan)
    })
}

fn sleep_until_monotonic(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as libc::time_t,
        tv_nsec: (t % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: absolute sleep on CLOCK_MONOTONIC; EINTR just returns early.
    unsafe {
        libc::clock_nanosleep(
            libc::CLOCK_MONOTONIC,
            libc::TIMER_ABSTIME,
            &ts,
            std::ptr::null_mut(),
        )
    };
}

fn send_loop(sock: &UdpSocket, plan: &SendPlan) -> io::Result<SendStats> {
    let fd = sock.as_raw_fd();
    let batch = plan.batch.clamp(1, 64);
    let size = plan.payload.max(16);
    let mut bufs = vec![vec![0x5au8; size]; batch];
    let start = sys::monotonic_ns();
    let end = plan.duration.map(|d| start + d.as_nanos() as u64);
    let mut sent = 0u64;
    while sent < plan.count {
        if end.is_some_and(|e| sys::monotonic_ns() >= e) {
            break;
        }
        if plan.pps > 0.0 {
            let due = start + (sent as f64 * 1e9 / plan.pps) as u64;
            if sys::monotonic_ns() < due {
                sleep_until_monotonic(due);
            }
        }
        let k = batch.min((plan.count - sent) as usize);
        let now = sys::realtime_ns();
        let mut iovs: [libc::iovec; 64] = [libc::iovec {
            iov_base: std::ptr::null_mut(),
            iov_len: 0,
        }; 64];
        // SAFETY: zeroed mmsghdr array is valid; pointers set below.
        let mut msgs: [libc::mmsghdr; 64] = unsafe { zeroed() };
        for i in 0..k {
            let b = &mut bufs[i];
            b[0..8].copy_from_slice(&(sent + i as u64).to_le_bytes());
            b[8..16].copy_from_slice(&now.to_le_bytes());
            iovs[i].iov_base = b.as_mut_ptr().cast();
            iovs[i].iov_len = b.len();
            msgs[i].msg_hdr.msg_iov = &mut iovs[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        // SAFETY: msgs/iovs point at live buffers for k entries.
        let r = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), k as u32, 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::ENOBUFS) | Some(libc::EAGAIN) | Some(libc::EINTR) => continue,
                _ => return Err(e),
            }
        }
        sent += r as u64;
    }
    Ok(SendStats {
        sent,
        elapsed_ns: sys::monotonic_ns() - start,
    })
}

/// Percentile (0..=1) of a sorted slice, nearest-rank.
pub fn percentile(sorted: &[i64], q: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i]
}
