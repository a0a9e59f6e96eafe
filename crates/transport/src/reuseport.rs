//! Several controller-agent processes on one UDP port: a `SO_REUSEPORT`
//! group whose sockets are opened together, in a fixed order, by one
//! supervising process, and a classic-BPF steering program that sends every
//! packet of a connection to the socket of the worker that owns it.
//!
//! Why one process opens them all: a classic-BPF reuseport program
//! (`SO_ATTACH_REUSEPORT_CBPF`) returns a socket's *index* in the group, which
//! is the order the sockets joined, and the kernel fills the hole a closing
//! socket leaves with the last one. Independent processes that restart would
//! reshuffle the indices (and every 4-tuple hash with them). The supervisor
//! keeps every socket open for the group's lifetime; a worker that dies is
//! restarted on the *same* socket, so indices and hashes never move.
//!
//! Steering (what the program reads, RFC 9000 §17): the worker's connection
//! IDs carry its index as the octet after the host's server id (none without
//! `--server-id`), in the QUIC-LB draft's unencrypted form
//! ([`crate::quic_lb`]). RFC 9000 §5.1: "connection IDs
//! [...] ensure that changes in addressing at lower protocol layers (UDP, IP)
//! do not cause packets for a QUIC connection to be delivered to the wrong
//! endpoint", and §9 (connection migration) needs exactly that: after a
//! switch's address changes, its short-header packets still name our ID.
//!
//! * short header (first bit 0): the destination ID starts at octet 1 with no
//!   length; its first octet must be ours (config rotation and length,
//!   draft-ietf-quic-load-balancers "First Octet"), then the worker octet
//!   follows the host's server id (octet 2 without one);
//! * long header (first bit 1): octet 5 is the destination ID's length
//!   (§17.2), then the ID: the same check from octet 6 on. The host's
//!   server id itself is not checked: the balancer routed by it, and a
//!   foreign one fails the worker's keyed check (no reset either). A client's first
//!   Initial and its 0-RTT packets carry an ID the client chose, which fails
//!   the check (or, by chance, passes it: then all of them, having the same
//!   ID, still go to one worker);
//! * anything else, and server ids beyond the group: the program returns an
//!   index past the end, and the kernel falls back to its 4-tuple hash
//!   (draft-ietf-quic-load-balancers §4: unroutable connection IDs are routed
//!   by the 4-tuple). A switch's new connection thus lands on the worker its
//!   address hashes to, the same one every time while the group is unchanged.

use crate::quic_lb::ServerIdCidGenerator;
use quinn_proto::ConnectionIdGenerator;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// `SO_ATTACH_REUSEPORT_CBPF` (linux/include/uapi/asm-generic/socket.h); not
/// in the libc crate for every Linux target.
const SO_ATTACH_REUSEPORT_CBPF: libc::c_int = 51;

/// Workers one group can steer to: the worker is one octet of the ID.
pub const MAX_WORKERS: usize = 256;

/// The config rotation codepoint of the workers' connection IDs.
pub const CONFIG_ROTATION: u8 = 0;

// Classic BPF opcodes (linux/include/uapi/linux/bpf_common.h, filter.h).
const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const RET_A: u16 = 0x16; // BPF_RET | BPF_A
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

/// Returned for packets that carry no routable server id: past the last
/// socket, so the kernel uses its hash (net/core/sock_reuseport.c: "no bpf or
/// invalid bpf result: fall back to hash usage").
const UNROUTABLE: u32 = u32::MAX;

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The first octet and length of the workers' connection IDs on a host
/// whose server id is `host_id_len` octets (0: none).
pub fn cid_shape(host_id_len: usize) -> (u8, usize) {
    let g = ServerIdCidGenerator::new(CONFIG_ROTATION, &vec![0; host_id_len + 1], 0).expect(
        "a host server id of at most MAX_HOST_SERVER_ID_LEN octets and rotation 0 are valid",
    );
    let len = g.cid_len();
    ((CONFIG_ROTATION << 5) | (len - 1) as u8, len)
}

/// The steering program for `workers` sockets on a host whose server id is
/// `host_id_len` octets (see the module docs). The packet seen by a
/// reuseport program starts at the UDP payload.
pub fn steering_program(workers: usize, host_id_len: usize) -> Vec<libc::sock_filter> {
    let (first, len) = cid_shape(host_id_len);
    let (first, len, n) = (u32::from(first), len as u32, workers as u32);
    let worker = host_id_len as u32;
    vec![
        /* 0 */ insn(LDB_ABS, 0, 0, 0),
        // Header form bit (RFC 9000 §17.2 / §17.3): 1 is a long header.
        /* 1 */
        insn(JSET_K, 5, 0, 0x80),
        // Short header: DCID at octet 1.
        /* 2 */ insn(LDB_ABS, 0, 0, 1),
        /* 3 */ insn(JEQ_K, 0, 10, first),
        /* 4 */ insn(LDB_ABS, 0, 0, 2 + worker),
        /* 5 */ insn(JGE_K, 8, 0, n),
        /* 6 */ insn(RET_A, 0, 0, 0),
        // Long header: DCID length at octet 5, DCID at octet 6.
        /* 7 */
        insn(LDB_ABS, 0, 0, 5),
        /* 8 */ insn(JEQ_K, 0, 5, len),
        /* 9 */ insn(LDB_ABS, 0, 0, 6),
        /* 10 */ insn(JEQ_K, 0, 3, first),
        /* 11 */ insn(LDB_ABS, 0, 0, 7 + worker),
        /* 12 */ insn(JGE_K, 1, 0, n),
        /* 13 */ insn(RET_A, 0, 0, 0),
        /* 14 */ insn(RET_K, 0, 0, UNROUTABLE),
    ]
}

/// Opens `workers` UDP sockets on `addr` in one `SO_REUSEPORT` group, in
/// order (socket *i* is worker *i*'s), with the steering program attached
/// for a host whose server id is `host_id_len` octets (0: none). With port 0
/// the first socket picks the port and the others join it.
pub fn bind_group(
    addr: SocketAddr,
    workers: usize,
    host_id_len: usize,
) -> io::Result<Vec<UdpSocket>> {
    if workers == 0 || workers > MAX_WORKERS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a reuseport group takes 1 to {MAX_WORKERS} workers, not {workers}"),
        ));
    }
    if host_id_len > crate::quic_lb::MAX_HOST_SERVER_ID_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "a host server id takes at most {} octets, not {host_id_len}",
                crate::quic_lb::MAX_HOST_SERVER_ID_LEN
            ),
        ));
    }
    let mut addr = addr;
    let mut sockets = Vec::with_capacity(workers);
    for _ in 0..workers {
        let socket = crate::quic::udp_socket_with(addr, true)?;
        addr = socket.local_addr()?;
        sockets.push(socket);
    }
    attach(&sockets[0], &steering_program(workers, host_id_len))?;
    Ok(sockets)
}

/// Attaches a reuseport program to `socket`'s group (any member will do).
fn attach(socket: &UdpSocket, program: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `program`, alive for the call; the kernel
    // copies the program.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_CBPF,
            (&fprog as *const libc::sock_fprog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cannot attach the reuseport steering program: {e}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn short(host: &[u8], worker: u8) -> Vec<u8> {
        let (first, len) = cid_shape(host.len());
        let mut p = vec![0x40, first];
        p.extend_from_slice(host);
        p.push(worker);
        p.resize(1 + len + 20, 0xaa);
        p
    }

    fn long(dcid_len: u8, first: u8, host: &[u8], worker: u8) -> Vec<u8> {
        // Handshake packet type, version 1, DCID length, DCID, SCID length 0.
        let mut p = vec![0xe0, 0, 0, 0, 1, dcid_len];
        let mut dcid = vec![first];
        dcid.extend_from_slice(host);
        dcid.push(worker);
        dcid.resize(dcid_len as usize, 0x55);
        p.extend_from_slice(&dcid);
        p.push(0);
        p.resize(p.len() + 30, 0);
        p
    }

    /// Which socket of `group` receives `packet` from `from`.
    fn receiver(group: &[UdpSocket], from: &UdpSocket, packet: &[u8]) -> usize {
        from.send_to(packet, group[0].local_addr().unwrap())
            .unwrap();
        let mut buf = [0u8; 2048];
        for _ in 0..200 {
            for (i, s) in group.iter().enumerate() {
                if let Ok(n) = s.recv(&mut buf) {
                    assert_eq!(&buf[..n], packet);
                    return i;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        panic!("no socket of the group received the packet");
    }

    #[test]
    fn packets_reach_the_worker_their_connection_id_names() {
        // Without a host server id, and behind a balancer with a two-octet one.
        for host in [&[][..], &[0x0a, 0x0b][..]] {
            let group = bind_group("127.0.0.1:0".parse().unwrap(), 3, host.len()).unwrap();
            let port = group[0].local_addr().unwrap().port();
            assert!(group.iter().all(|s| s.local_addr().unwrap().port() == port));
            for s in &group {
                s.set_nonblocking(true).unwrap();
            }
            let (first, len) = cid_shape(host.len());
            // Two clients, as a switch before and after migration (another port).
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            for from in [&a, &b] {
                for id in 0..3u8 {
                    assert_eq!(receiver(&group, from, &short(host, id)), id as usize);
                    assert_eq!(
                        receiver(&group, from, &long(len as u8, first, host, id)),
                        id as usize
                    );
                }
            }
            // Unroutable: a worker past the group, a foreign first octet (also
            // the other host shape's), a client-chosen 20-octet Initial ID. The
            // hash decides, the same way every time for one 4-tuple.
            let (other_first, _) = cid_shape(2 - host.len());
            for p in [
                short(host, 7),
                long(len as u8, first ^ 0x20, host, 1),
                long(len as u8, other_first, host, 1),
                long(20, 0x12, host, 1),
            ] {
                let i = receiver(&group, &a, &p);
                assert!(i < 3);
                for _ in 0..4 {
                    assert_eq!(receiver(&group, &a, &p), i);
                }
            }
        }
    }

    #[test]
    fn group_sizes_are_checked() {
        let any = "127.0.0.1:0".parse().unwrap();
        assert!(bind_group(any, 0, 0).is_err());
        assert!(bind_group(any, MAX_WORKERS + 1, 0).is_err());
        let too_long = crate::quic_lb::MAX_HOST_SERVER_ID_LEN + 1;
        assert!(bind_group(any, 2, too_long).is_err());
    }
}
