//! The switch agents a controller agent serves, written down beside its
//! session store, so that the agent that replaces it after a crash can tell
//! every one of them at once that its connection is gone.
//!
//! Why: after a crash (SIGKILL, an OOM kill) no CONNECTION_CLOSE leaves. A
//! switch agent learns of it only when its next packet reaches the new agent
//! and earns a stateless reset (RFC 9000 §10.3): OVS's echo or a keep-alive,
//! up to 5.25 s later. A packet sent before the new agent listens is lost,
//! and its retransmission waits a probe timeout that the restart's load
//! stretches, so OVS's inactivity probe (5 s) expired for 5–16 % of 10,000
//! switches per crash and those came back last (docs/scale.md). (After a
//! graceful stop most close packets do not leave before the process exits
//! either; there the roster made no measurable difference.)
//!
//! The new agent has none of its predecessor's state, but a stateless reset
//! needs little: the switch's address and the connection ID the switch sends
//! to, whose reset token is a function of the ID and the reset key alone
//! (§10.3.2), and that key survives restarts ([`crate::quic`]'s
//! `RestartStableKeys`). So the running agent records, from the datagrams it
//! receives, each address and the destination ID of its short-header packets
//! (the ID the switch currently uses, whose token the switch checks, §10.3.1),
//! and writes the list every [`ROUND`] when it changed. After a start, the
//! agent sends each one a stateless reset ([`Predecessors`]) unless it has
//! heard from that address already.
//!
//! RFC 9000 §10.3 has an endpoint send a stateless reset "in response to
//! receiving a packet that it cannot associate with an active connection".
//! These are sent unprompted, at most once per recorded peer and start, for
//! connections this endpoint's predecessor held: as small as a reset may
//! look (41 bytes, below), so they amplify nothing, and a peer that does not
//! recognise one drops it (§10.3.1). A reset that reaches a live connection
//! ends it, which is what the predecessor's exit already did.
//!
//! Entries are recorded from unauthenticated datagrams, so the table is
//! capped ([`MAX_PEERS`]) and forgets what it has not seen for
//! [`STALE_ROUNDS`] rounds: junk costs at most that many 41-byte resets at
//! the next start, and a full table only means that switches beyond it learn
//! of a crash the old way.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::io::{self, IoSliceMut, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::ConnectionId;
use quinn::udp::RecvMeta;

/// How often the table is written when it changed.
pub const ROUND: Duration = Duration::from_secs(2);

/// Rounds after which an address that sent nothing is forgotten: 30 s. A
/// connected switch agent sends at least every keep-alive interval, which is
/// shorter than its grace period, at most 14 s (below OVS's 15 s fail-mode
/// timeout), and OVS's echo every 5 s crosses it too.
pub const STALE_ROUNDS: u32 = 15;

/// Addresses kept at most (about 100 bytes each in memory, 40 in the file):
/// five times what one agent serves in docs/scale.md's model (12,500).
pub const MAX_PEERS: usize = 64 * 1024;

/// Where the roster of a session store at `store` lives: `STORE.peers`.
pub fn path_for(store: &Path) -> PathBuf {
    crate::files::suffixed(store, ".peers")
}

/// A switch agent as the roster knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub address: SocketAddr,
    /// The connection ID its packets are addressed to (one this agent issued).
    pub cid: ConnectionId,
}

struct Seen {
    cid: ConnectionId,
    round: u32,
}

#[derive(Default)]
struct Table {
    peers: HashMap<SocketAddr, Seen>,
    round: u32,
    changed: bool,
}

/// The table, sans I/O: fed with received datagrams, asked once per round
/// for what to write.
pub struct Roster {
    cid_len: usize,
    table: Mutex<Table>,
}

impl fmt::Debug for Roster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Roster(cid_len {})", self.cid_len)
    }
}

impl Roster {
    /// A roster for an endpoint whose connection IDs are `cid_len` bytes.
    pub fn new(cid_len: usize) -> Self {
        Roster {
            cid_len,
            table: Mutex::new(Table::default()),
        }
    }

    /// Datagrams received, each with its source.
    pub fn observe<'a>(&self, datagrams: impl IntoIterator<Item = (SocketAddr, &'a [u8])>) {
        let mut table = self.table.lock().unwrap();
        let round = table.round;
        for (from, datagram) in datagrams {
            // RFC 9000 §17.3.1: a short header is "Header Form (1) = 0" then,
            // after the first byte, the Destination Connection ID, whose
            // length the receiver knows (its own IDs' length). Long headers
            // (handshakes) carry IDs the switch chose at first: skipped.
            if datagram.len() <= self.cid_len || datagram[0] & 0x80 != 0 {
                continue;
            }
            let cid = &datagram[1..1 + self.cid_len];
            let full = table.peers.len() >= MAX_PEERS;
            match table.peers.get_mut(&from) {
                Some(seen) if seen.cid[..] == *cid => seen.round = round,
                Some(seen) => {
                    seen.cid = ConnectionId::new(cid);
                    seen.round = round;
                    table.changed = true;
                }
                None if full => {}
                None => {
                    table.peers.insert(
                        from,
                        Seen {
                            cid: ConnectionId::new(cid),
                            round,
                        },
                    );
                    table.changed = true;
                }
            }
        }
    }

    /// Ends a round: forgets addresses not seen for [`STALE_ROUNDS`] and
    /// returns the roster to write if it changed since the last write.
    pub fn next_round(&self) -> Option<Vec<Peer>> {
        let mut table = self.table.lock().unwrap();
        let round = table.round;
        let before = table.peers.len();
        table
            .peers
            .retain(|_, seen| round.wrapping_sub(seen.round) < STALE_ROUNDS);
        table.changed |= table.peers.len() != before;
        table.round = round.wrapping_add(1);
        if !std::mem::take(&mut table.changed) {
            return None;
        }
        let mut peers: Vec<Peer> = table
            .peers
            .iter()
            .map(|(address, seen)| Peer {
                address: *address,
                cid: seen.cid,
            })
            .collect();
        peers.sort_by_key(|p| p.address);
        Some(peers)
    }

    /// Whether `address` has sent this endpoint a short-header packet within
    /// the last [`STALE_ROUNDS`] rounds.
    pub fn knows(&self, address: &SocketAddr) -> bool {
        self.table.lock().unwrap().peers.contains_key(address)
    }

    /// Makes the next [`next_round`](Self::next_round) return the roster even
    /// if nothing changed: after a write failed.
    pub fn mark_changed(&self) {
        self.table.lock().unwrap().changed = true;
    }
}

const HEADER: &str = "# quicsdn controller agent peers v1: address, connection ID (hex)";

/// The file's text: a header line, then one `ADDRESS CID` line per peer.
pub fn encode(peers: &[Peer]) -> String {
    let mut text = String::with_capacity(HEADER.len() + 1 + peers.len() * 40);
    text.push_str(HEADER);
    text.push('\n');
    for p in peers {
        use std::fmt::Write as _;
        let _ = write!(text, "{} ", p.address);
        for b in p.cid.iter() {
            let _ = write!(text, "{b:02x}");
        }
        text.push('\n');
    }
    text
}

/// The peers in a roster's text, and how many lines were not understood.
pub fn decode(text: &str) -> (Vec<Peer>, usize) {
    let mut peers = Vec::new();
    let mut bad = 0;
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        match parse_line(line) {
            Some(p) => peers.push(p),
            None => bad += 1,
        }
    }
    (peers, bad)
}

/// RFC 9000 §17.2: "In QUIC version 1, this value MUST NOT exceed 20 bytes."
const MAX_CID_LEN: usize = 20;

fn parse_line(line: &str) -> Option<Peer> {
    let (address, cid) = line.split_once(' ')?;
    let address = address.parse().ok()?;
    let hex = cid.trim();
    if hex.len() % 2 != 0 || hex.len() / 2 > MAX_CID_LEN || hex.is_empty() {
        return None;
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some(Peer {
        address,
        cid: ConnectionId::new(&bytes),
    })
}

/// Writes the roster to `path` (mode 0600, through a temporary file and a
/// rename, so a reader never sees half of it).
pub fn save(path: &Path, peers: &[Peer]) -> io::Result<()> {
    let tmp = crate::files::temp_path(path);
    let mut f = crate::files::open_private(&tmp, true)?;
    f.write_all(encode(peers).as_bytes())?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// A stateless reset's length: 24 unpredictable bytes and the token, 41 in
/// all, the size quinn's own resets have when the packet that prompted one
/// allows it (5 bytes and the longest connection ID, 20): a short-header
/// packet for any ID length could be that long, so an observer cannot tell
/// the reset from one (RFC 9000 §10.3: "indistinguishable from a regular
/// packet with a short header").
pub const RESET_LEN: usize = 1 + 24 + RESET_TOKEN_LEN;
const RESET_TOKEN_LEN: usize = 16;

/// A stateless reset for `cid` (RFC 9000 §10.3):
///
/// ```text
/// Stateless Reset {
///   Fixed Bits (2) = 1,
///   Unpredictable Bits (38..),
///   Stateless Reset Token (128),
/// }
/// ```
///
/// The token is quinn's: the first 16 bytes of the reset key's HMAC of the
/// ID (§10.3.2, "a static key ... used to generate ... tokens").
pub fn reset_datagram(
    key: &dyn quinn::crypto::HmacKey,
    cid: &ConnectionId,
    unpredictable: [u8; RESET_LEN - RESET_TOKEN_LEN],
) -> [u8; RESET_LEN] {
    let mut datagram = [0u8; RESET_LEN];
    datagram[..RESET_LEN - RESET_TOKEN_LEN].copy_from_slice(&unpredictable);
    datagram[0] = 0b0100_0000 | (unpredictable[0] >> 2);
    let mut signature = vec![0u8; key.signature_len()];
    key.sign(cid, &mut signature);
    datagram[RESET_LEN - RESET_TOKEN_LEN..].copy_from_slice(&signature[..RESET_TOKEN_LEN]);
    datagram
}

/// The switch agents a predecessor on this address recorded, to be reset
/// from this agent's socket at the pace it can take them back: all at once,
/// 10,000 switch agents reconnecting together overflowed the handshake queue
/// (more refusals, each costing a 0-RTT ticket; docs/scale.md), while most of
/// them learn of the crash from their own next packet anyway. The caller
/// decides the pace ([`send`](Self::send)).
pub struct Predecessors {
    peers: Vec<Peer>,
    next: usize,
    sent: usize,
    skipped: usize,
    key: Arc<dyn quinn::crypto::HmacKey>,
    socket: UdpSocket,
}

impl fmt::Debug for Predecessors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Predecessors({} of {})", self.next, self.peers.len())
    }
}

impl Predecessors {
    /// The roster file at `path` (`None` if there is none or it lists no
    /// one), and how many of its lines were not understood. `socket` is a
    /// clone of the endpoint's; `key` its stateless-reset key.
    pub fn load(
        path: &Path,
        key: Arc<dyn quinn::crypto::HmacKey>,
        socket: UdpSocket,
    ) -> io::Result<(Option<Predecessors>, usize)> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, 0)),
            Err(e) => return Err(e),
        };
        let (mut peers, bad) = decode(&text);
        peers.truncate(MAX_PEERS);
        if peers.is_empty() {
            return Ok((None, bad));
        }
        let predecessors = Predecessors {
            peers,
            next: 0,
            sent: 0,
            skipped: 0,
            key,
            socket,
        };
        Ok((Some(predecessors), bad))
    }

    /// Peers in the file.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The connection IDs the predecessor's switch agents send to.
    pub fn cids(&self) -> impl Iterator<Item = &ConnectionId> {
        self.peers.iter().map(|p| &p.cid)
    }

    /// Whether every peer has had its turn.
    pub fn is_done(&self) -> bool {
        self.next == self.peers.len()
    }

    /// Resets sent, and peers skipped because they were back already.
    pub fn counts(&self) -> (usize, usize) {
        (self.sent, self.skipped)
    }

    /// Sends up to `budget` more resets, skipping peers for which `back`
    /// (the address has sent this agent a packet since it started: it has
    /// reconnected, or its own packet earned it a reset) holds. Stops early
    /// when the socket's send buffer is full; the rest go next time. Returns
    /// how many were sent.
    pub fn send(&mut self, budget: usize, back: impl Fn(&SocketAddr) -> bool) -> usize {
        let mut sent = 0;
        while sent < budget && self.next < self.peers.len() {
            let p = &self.peers[self.next];
            if back(&p.address) {
                self.skipped += 1;
                self.next += 1;
                continue;
            }
            let datagram = reset_datagram(&*self.key, &p.cid, rand::random());
            match self.socket.send_to(&datagram, p.address) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // One unreachable or refused address costs only its own reset.
                Err(_) => {}
                Ok(_) => {
                    sent += 1;
                    self.sent += 1;
                }
            }
            self.next += 1;
        }
        sent
    }
}

/// A connection-ID generator that never issues an ID a predecessor's switch
/// agent still sends to.
///
/// Why: a restarted agent draws its IDs from the space its predecessor drew
/// from, and a switch agent that has not yet learned of the restart and sends
/// to an ID the new agent has just issued to another switch is routed to that
/// connection, where its packets fail to decrypt and are dropped: it earns no
/// stateless reset (RFC 9000 §10.3: those answer packets "that it cannot
/// associate with an active connection"), and the roster's own reset skips
/// it, as its address has been heard from. It then waits out its idle timer,
/// which a restart's load stretches (docs/scale.md, "A dead peer after a
/// storm"). With 4-byte IDs, 10,000 switches and ~50,000 IDs issued in a
/// restart, about 0.1 such switches are expected per restart (single
/// stragglers were seen in 4 of 80); with the roster's IDs held back, none
/// that the roster knows. quinn already keeps the agent's own live IDs apart.
pub struct NotTaken<G> {
    inner: G,
    taken: Arc<HashSet<ConnectionId>>,
}

/// Draws before an ID is issued regardless (a roster of up to [`MAX_PEERS`]
/// IDs leaves a 4-byte draw free with a probability above 0.99998, so this
/// bound is never reached short of a far smaller ID space).
const MAX_DRAWS: usize = 64;

impl<G> NotTaken<G> {
    pub fn new(inner: G, taken: Arc<HashSet<ConnectionId>>) -> Self {
        NotTaken { inner, taken }
    }
}

impl<G: quinn::ConnectionIdGenerator> quinn::ConnectionIdGenerator for NotTaken<G> {
    fn generate_cid(&mut self) -> ConnectionId {
        let mut cid = self.inner.generate_cid();
        for _ in 1..MAX_DRAWS {
            if !self.taken.contains(&cid) {
                break;
            }
            cid = self.inner.generate_cid();
        }
        cid
    }

    fn validate(&self, cid: &ConnectionId) -> Result<(), quinn_proto::InvalidCid> {
        self.inner.validate(cid)
    }

    fn cid_len(&self) -> usize {
        self.inner.cid_len()
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        self.inner.cid_lifetime()
    }
}

/// On a [`crate::tapped::Tapped`] socket, every datagram quinn receives is
/// fed to the roster on its way.
impl crate::tapped::Tap for Roster {
    fn incoming(&self, bufs: &[IoSliceMut<'_>], meta: &mut [RecvMeta]) {
        self.observe(received(bufs, meta));
    }
}

/// Each datagram of a receive batch with its source: a buffer holds
/// `len / stride` of them when the kernel coalesced (GRO).
fn received<'a>(
    bufs: &'a [IoSliceMut<'_>],
    meta: &'a [RecvMeta],
) -> impl Iterator<Item = (SocketAddr, &'a [u8])> + 'a {
    bufs.iter().zip(meta).flat_map(|(buf, m)| {
        let stride = m.stride.max(1);
        buf[..m.len.min(buf.len())]
            .chunks(stride)
            .map(move |d| (m.addr, d))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hands out the IDs 0, 1, 2, … (one byte each).
    struct Counting(u8);

    impl quinn::ConnectionIdGenerator for Counting {
        fn generate_cid(&mut self) -> ConnectionId {
            self.0 += 1;
            ConnectionId::new(&[self.0 - 1])
        }
        fn cid_len(&self) -> usize {
            1
        }
        fn cid_lifetime(&self) -> Option<Duration> {
            None
        }
    }

    #[test]
    fn ids_the_predecessors_switches_use_are_never_issued() {
        use quinn::ConnectionIdGenerator;
        let taken: HashSet<ConnectionId> = [0u8, 1, 3, 4, 5]
            .iter()
            .map(|b| ConnectionId::new(&[*b]))
            .collect();
        let mut g = NotTaken::new(Counting(0), Arc::new(taken));
        let issued: Vec<u8> = (0..3).map(|_| g.generate_cid()[0]).collect();
        assert_eq!(issued, [2, 6, 7]);
        assert_eq!(g.cid_len(), 1);
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([192, 0, 2, 1], port))
    }

    fn short(cid: &[u8], payload: usize) -> Vec<u8> {
        let mut d = vec![0x40];
        d.extend_from_slice(cid);
        d.resize(d.len() + payload, 0xab);
        d
    }

    #[test]
    fn short_headers_are_recorded_with_their_destination_id_and_long_ones_are_not() {
        let r = Roster::new(4);
        let mut initial = vec![0xc0, 0, 0, 0, 1, 4];
        initial.extend_from_slice(&[9, 9, 9, 9]);
        initial.resize(1200, 0);
        let data = short(&[1, 2, 3, 4], 30);
        r.observe([
            (addr(1), &data[..]),
            (addr(2), &initial[..]),
            // Too short to hold an ID: not a packet of ours.
            (addr(3), &[0x40, 1, 2][..]),
        ]);
        let peers = r.next_round().expect("a new peer is a change");
        assert_eq!(
            peers,
            [Peer {
                address: addr(1),
                cid: ConnectionId::new(&[1, 2, 3, 4])
            }]
        );
        // The same again is no change; a new ID from the same address is.
        r.observe([(addr(1), &data[..])]);
        assert_eq!(r.next_round(), None);
        r.observe([(addr(1), &short(&[5, 6, 7, 8], 30)[..])]);
        assert_eq!(
            r.next_round().unwrap()[0].cid,
            ConnectionId::new(&[5, 6, 7, 8])
        );
    }

    #[test]
    fn a_silent_address_is_forgotten_after_its_stale_rounds_and_a_talking_one_is_kept() {
        let r = Roster::new(4);
        let a = short(&[1, 1, 1, 1], 20);
        let b = short(&[2, 2, 2, 2], 20);
        r.observe([(addr(1), &a[..]), (addr(2), &b[..])]);
        assert_eq!(r.next_round().unwrap().len(), 2);
        for _ in 1..STALE_ROUNDS {
            r.observe([(addr(1), &a[..])]);
            assert_eq!(r.next_round(), None);
        }
        r.observe([(addr(1), &a[..])]);
        let left = r.next_round().expect("forgetting is a change");
        assert_eq!(
            left.iter().map(|p| p.address).collect::<Vec<_>>(),
            [addr(1)]
        );
    }

    #[test]
    fn the_table_is_capped() {
        let r = Roster::new(4);
        let d = short(&[1, 2, 3, 4], 20);
        let many: Vec<_> = (0..MAX_PEERS as u32 + 10)
            .map(|i| SocketAddr::from((std::net::Ipv4Addr::from(i), 1)))
            .collect();
        r.observe(many.iter().map(|a| (*a, &d[..])));
        assert_eq!(r.next_round().unwrap().len(), MAX_PEERS);
    }

    #[test]
    fn the_file_round_trips_and_bad_lines_are_counted_not_fatal() {
        let peers = vec![
            Peer {
                address: addr(6653),
                cid: ConnectionId::new(&[0xde, 0xad, 0xbe, 0xef]),
            },
            Peer {
                address: "[2001:db8::1]:4000".parse().unwrap(),
                cid: ConnectionId::new(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
            },
        ];
        let text = encode(&peers);
        assert_eq!(decode(&text), (peers.clone(), 0));
        let damaged =
            format!("{text}not an address 0102\n192.0.2.9:1 0g\n192.0.2.9:1 010\n192.0.2.9:1\n");
        assert_eq!(decode(&damaged), (peers, 4));
    }

    #[test]
    fn a_reset_carries_the_ids_token_and_looks_like_a_short_header() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"reset key");
        let cid = ConnectionId::new(&[1, 2, 3, 4]);
        let d = reset_datagram(&key, &cid, [0xff; RESET_LEN - RESET_TOKEN_LEN]);
        assert_eq!(d.len(), 41);
        // Header Form 0, Fixed Bit 1 (RFC 9000 §10.3).
        assert_eq!(d[0] & 0xc0, 0x40);
        let tag = ring::hmac::sign(&key, &cid);
        assert_eq!(&d[25..], &tag.as_ref()[..16]);
    }

    #[test]
    fn predecessors_are_reset_within_the_budget_and_those_back_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions.peers");
        let switches: Vec<UdpSocket> = (0..3)
            .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        let peers: Vec<Peer> = switches
            .iter()
            .enumerate()
            .map(|(i, s)| Peer {
                address: s.local_addr().unwrap(),
                cid: ConnectionId::new(&[i as u8; 4]),
            })
            .collect();
        save(&path, &peers).unwrap();
        let key = Arc::new(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k"));
        let agent = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (p, bad) = Predecessors::load(&path, key.clone(), agent).unwrap();
        let mut p = p.expect("three peers");
        assert_eq!((p.len(), bad), (3, 0));
        assert_eq!(p.send(1, |_| false), 1);
        assert!(!p.is_done());
        // The second switch is back already: skipped, not counted in the budget.
        let back = peers[1].address;
        assert_eq!(p.send(5, |a| *a == back), 1);
        assert!(p.is_done());
        assert_eq!(p.counts(), (2, 1));
        for i in [0, 2] {
            let mut buf = [0u8; 64];
            switches[i]
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let n = switches[i].recv(&mut buf).unwrap();
            let tag = ring::hmac::sign(&key, &peers[i].cid);
            assert_eq!((n, &buf[25..41]), (RESET_LEN, &tag.as_ref()[..16]));
        }
        // No file, or an empty one: nothing to do.
        let none = dir.path().join("none");
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(
            Predecessors::load(&none, key.clone(), socket)
                .unwrap()
                .0
                .is_none()
        );
        save(&none, &[]).unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(Predecessors::load(&none, key, socket).unwrap().0.is_none());
    }

    #[test]
    fn coalesced_receives_are_split_at_their_stride() {
        let mut a = short(&[1, 1, 1, 1], 15);
        let b = short(&[2, 2, 2, 2], 15);
        a.extend_from_slice(&b);
        let mut storage = a.clone();
        let bufs = [IoSliceMut::new(&mut storage)];
        let m = RecvMeta {
            addr: addr(7),
            len: a.len(),
            stride: 20,
            ..Default::default()
        };
        let got: Vec<_> = received(&bufs, &[m])
            .map(|(f, d)| (f, d.to_vec()))
            .collect();
        assert_eq!(got, [(addr(7), a[..20].to_vec()), (addr(7), b)]);
    }
}
