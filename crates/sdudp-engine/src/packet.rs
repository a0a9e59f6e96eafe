//! Raw frame I/O on one interface (an AF_PACKET socket), and the trait the
//! engines' loops use, so tests can drive them without a kernel.

use anyhow::{Context, Result, bail};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// Frames in and out of a switch port.
pub trait FrameIo {
    /// One frame into `buf` if one is waiting (never blocks).
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>>;
    fn send(&mut self, frame: &[u8]) -> io::Result<()>;
    /// Waits until a frame may be waiting or `timeout` passed.
    fn wait(&mut self, timeout: Duration) -> io::Result<()>;
}

/// An AF_PACKET socket bound to one interface: every frame the interface
/// receives, none it sends.
pub struct PacketSocket {
    fd: OwnedFd,
    ifindex: i32,
    pub name: String,
}

const ETH_P_ALL: u16 = 0x0003;

impl PacketSocket {
    pub fn open(name: &str) -> Result<PacketSocket> {
        let cname = CString::new(name).context("interface name")?;
        // SAFETY: a valid NUL-terminated string.
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            bail!("no interface {name:?} in this network namespace");
        }
        // SAFETY: plain socket(2); the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ALL.to_be()),
            )
        };
        if raw < 0 {
            return Err(io::Error::last_os_error())
                .context("AF_PACKET socket (needs CAP_NET_RAW: run as root)");
        }
        // SAFETY: `raw` is a new descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = ifindex;
        // SAFETY: `sll` is a valid sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error()).with_context(|| format!("bind to {name}"));
        }
        // Engines forward bursts of up to a window of datagrams; the default
        // socket buffers (~200 KB) would drop most of a burst before the
        // engine reads it. Root may exceed the sysctl limits (…FORCE).
        for opt in [libc::SO_RCVBUFFORCE, libc::SO_SNDBUFFORCE] {
            let size: libc::c_int = 16 << 20;
            // SAFETY: a valid socket and an int option.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &size as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as u32,
                );
            }
        }
        Ok(PacketSocket {
            fd,
            ifindex,
            name: name.to_string(),
        })
    }
}

impl AsRawFd for PacketSocket {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

impl FrameIo for PacketSocket {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: `buf` and `sll` are valid for the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                    &mut sll as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                    &mut len,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            // Our own transmissions come back on ETH_P_ALL sockets: skip them.
            if sll.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }

    fn send(&mut self, frame: &[u8]) -> io::Result<()> {
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_ifindex = self.ifindex;
        sll.sll_halen = 6;
        sll.sll_addr[..6].copy_from_slice(&frame[..6]);
        loop {
            // SAFETY: `frame` and `sll` are valid for the sizes given.
            let n = unsafe {
                libc::sendto(
                    self.fd.as_raw_fd(),
                    frame.as_ptr() as *const libc::c_void,
                    frame.len(),
                    0,
                    &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_ll>() as u32,
                )
            };
            if n >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::Interrupted => continue,
                // The device queue is full: wait for room rather than drop
                // (what the engine sends, it still holds anyway).
                io::ErrorKind::WouldBlock => {
                    let mut p = libc::pollfd {
                        fd: self.fd.as_raw_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one valid pollfd.
                    unsafe { libc::poll(&mut p, 1, 10) };
                }
                _ => return Err(e),
            }
        }
    }

    fn wait(&mut self, timeout: Duration) -> io::Result<()> {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // poll(2) counts milliseconds: round up so a timer is never early.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut p, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        Ok(())
    }
}
