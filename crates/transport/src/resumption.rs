//! The controller agent's TLS session store: what 0-RTT resumption rests on.
//!
//! rustls accepts 0-RTT only with *stateful* resumption: a ticket is the id of
//! a session kept by the server, and each is taken out when used, so a ticket
//! works once. RFC 8446 §8.1: "The simplest form of anti-replay defense is for
//! the server to only allow each session ticket to be used once." With a file
//! (`--session-store`) the sessions — and their single use — survive a
//! restart of the controller agent, so switch agents reconnect in 0-RTT after
//! it; without one they live in memory.
//!
//! The file holds resumption secrets: whoever reads it can resume as any
//! switch. It is created with mode 0600 and belongs with the private key.
//! Format: a magic line, then records `put` (id, value, time) and `take` (id)
//! appended as they happen (one write each, no fsync: a crash of the process
//! loses nothing, a crash of the machine at worst the last tickets, which then
//! cost a full handshake). At start the log is replayed (a torn last record is
//! ignored) and rewritten with only live entries, and again whenever it has
//! grown to twice that.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};
use tracing::warn;

use crate::files::{open_private, temp_path};

const MAGIC: &[u8; 8] = b"QSDNSES1";
const PUT: u8 = 1;
const TAKE: u8 = 2;

/// How long a stored session is kept: rustls gives stateful tickets a 24-hour
/// lifetime.
pub const SESSION_LIFETIME_SECS: u64 = 24 * 60 * 60;

/// Sessions kept at most; the oldest go first. Each connection is given
/// [`crate::quic::TICKETS_PER_CONNECTION`] (4) tickets and a switch agent
/// uses its newest first, so this keeps every ticket of the last connection
/// of 16,384 switches: a restart of a controller agent with 10,000 switches
/// resumes them all in 0-RTT (32,768 kept only 8,192 switches' tickets, and
/// fewer than half of 10,000 resumed: docs/results/storm-10000). About 1 KiB
/// each as rustls encodes it, most of it the switch's certificate, which the
/// store keeps once per switch ([`Value`]): about 0.4 KiB each then, so at
/// most ~40 MiB with the certificates, taken only as tickets are issued.
pub const DEFAULT_CAPACITY: usize = 64 * 1024;

struct Entry {
    value: Value,
    stored: u64,
    seq: u64,
}

/// A session as rustls encoded it, with its large DER SEQUENCEs (the
/// switch's certificate chain) kept once for all the sessions that hold them:
/// every ticket of a switch carries the same certificate, about 60 % of the
/// session, and a store holds several per switch, more where attempts fail
/// and leave tickets behind (issue 18). The bytes are rebuilt exactly; what
/// counts as shareable is only a question of how much is saved.
struct Value(Vec<Piece>);

enum Piece {
    Own(Box<[u8]>),
    Shared(Arc<[u8]>),
}

/// A DER SEQUENCE with a two-byte length (X.690 §8.1.3.5: `0x30`, then
/// `0x82` and the length) of at least this many bytes is stored once. A
/// certificate is one; a random match in the secrets costs nothing but a
/// table entry for as long as its session lives.
const SHARED_MIN: usize = 256;

impl Value {
    fn new(bytes: &[u8], shared: &mut HashSet<Arc<[u8]>>) -> Value {
        let mut pieces = Vec::new();
        let (mut at, mut own_from) = (0, 0);
        while at + 4 <= bytes.len() {
            let len = 4 + usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
            if bytes[at] == 0x30
                && bytes[at + 1] == 0x82
                && len >= SHARED_MIN
                && at + len <= bytes.len()
            {
                if own_from < at {
                    pieces.push(Piece::Own(bytes[own_from..at].into()));
                }
                let blob = &bytes[at..at + len];
                let blob = match shared.get(blob) {
                    Some(b) => b.clone(),
                    None => {
                        let b: Arc<[u8]> = blob.into();
                        shared.insert(b.clone());
                        b
                    }
                };
                pieces.push(Piece::Shared(blob));
                at += len;
                own_from = at;
            } else {
                at += 1;
            }
        }
        if own_from < bytes.len() {
            pieces.push(Piece::Own(bytes[own_from..].into()));
        }
        Value(pieces)
    }

    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_to(&mut out);
        out
    }

    fn write_to(&self, out: &mut Vec<u8>) {
        for p in &self.0 {
            out.extend_from_slice(match p {
                Piece::Own(b) => b,
                Piece::Shared(b) => b,
            });
        }
    }

    /// Forgets the shared pieces only this session still holds.
    fn release(&self, shared: &mut HashSet<Arc<[u8]>>) {
        for p in &self.0 {
            // Held by the table and by this session alone.
            if let Piece::Shared(b) = p
                && Arc::strong_count(b) == 2
            {
                shared.remove(b);
            }
        }
    }
}

struct State {
    entries: HashMap<Vec<u8>, Entry>,
    /// The pieces sessions share (see [`Value`]).
    shared: HashSet<Arc<[u8]>>,
    /// Insertion order, for evicting the oldest.
    order: BTreeMap<u64, Vec<u8>>,
    next_seq: u64,
    log: Option<File>,
    /// Records in the log file, to know when to compact it.
    log_records: usize,
}

/// A [`rustls::server::StoresServerSessions`] kept in memory, optionally backed
/// by a file.
pub struct SessionStore {
    state: Mutex<State>,
    path: Option<PathBuf>,
    capacity: usize,
}

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secrets.
        f.debug_struct("SessionStore")
            .field("path", &self.path)
            .field("sessions", &self.len())
            .finish()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl SessionStore {
    /// A store in memory only: sessions end with the process.
    pub fn in_memory(capacity: usize) -> SessionStore {
        SessionStore {
            state: Mutex::new(State {
                entries: HashMap::new(),
                shared: HashSet::new(),
                order: BTreeMap::new(),
                next_seq: 0,
                log: None,
                log_records: 0,
            }),
            path: None,
            capacity,
        }
    }

    /// A store backed by `path`, created (mode 0600) if missing. Sessions older
    /// than their lifetime are dropped.
    pub fn open(path: &Path, capacity: usize) -> io::Result<SessionStore> {
        let with_path = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
        let store = SessionStore {
            path: Some(path.to_path_buf()),
            ..SessionStore::in_memory(capacity)
        };
        match std::fs::read(path) {
            Ok(bytes) => store.replay(&bytes).map_err(with_path)?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(with_path(e)),
        }
        store.compact().map_err(with_path)?;
        Ok(store)
    }

    /// Sessions stored now.
    pub fn len(&self) -> usize {
        self.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn replay(&self, bytes: &[u8]) -> io::Result<()> {
        let Some(mut rest) = bytes.strip_prefix(MAGIC.as_slice()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a quicsdn session store (wrong header)",
            ));
        };
        let mut st = self.lock();
        let oldest = now().saturating_sub(SESSION_LIFETIME_SECS);
        // A torn record at the end (the process died mid-write) ends the replay.
        while let Some((record, used)) = Record::decode(rest) {
            rest = &rest[used..];
            match record {
                Record::Put { key, value, stored } if stored >= oldest => {
                    insert(&mut st, key.to_vec(), value, stored, self.capacity);
                }
                Record::Put { .. } => {}
                Record::Take { key } => {
                    remove(&mut st, key);
                }
            }
        }
        Ok(())
    }

    /// Rewrites the file with only the live sessions, atomically.
    fn compact(&self) -> io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut st = self.lock();
        let tmp = temp_path(path);
        // Record by record: the whole store at once was tens of MiB in one
        // buffer at 10,000 switches.
        let mut f = BufWriter::new(open_private(&tmp, true)?);
        f.write_all(MAGIC)?;
        let (mut value, mut record) = (Vec::new(), Vec::new());
        for key in st.order.values() {
            let e = &st.entries[key];
            value.clear();
            e.value.write_to(&mut value);
            record.clear();
            Record::Put {
                key,
                value: &value,
                stored: e.stored,
            }
            .encode(&mut record);
            f.write_all(&record)?;
        }
        f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        st.log = Some(open_private(path, false)?);
        st.log_records = st.entries.len();
        Ok(())
    }

    /// Appends a record; on failure the store carries on in memory.
    fn append(&self, st: &mut State, record: Record<'_>) {
        let Some(log) = st.log.as_mut() else {
            return;
        };
        let mut buf = Vec::new();
        record.encode(&mut buf);
        if let Err(e) = log.write_all(&buf) {
            warn!(
                "cannot write the session store {}: {e}; sessions stay in memory only",
                self.path.as_deref().unwrap_or(Path::new("?")).display()
            );
            st.log = None;
            return;
        }
        st.log_records += 1;
    }

    fn maybe_compact(&self) {
        let grown = {
            let st = self.lock();
            st.log.is_some() && st.log_records > 2 * st.entries.len() + 1024
        };
        if grown && let Err(e) = self.compact() {
            warn!(
                "cannot rewrite the session store {}: {e}",
                self.path.as_deref().unwrap_or(Path::new("?")).display()
            );
        }
    }
}

fn insert(st: &mut State, key: Vec<u8>, value: &[u8], stored: u64, capacity: usize) {
    remove(st, &key);
    let seq = st.next_seq;
    st.next_seq += 1;
    let value = Value::new(value, &mut st.shared);
    st.order.insert(seq, key.clone());
    st.entries.insert(key, Entry { value, stored, seq });
    while st.entries.len() > capacity {
        let Some((_, oldest)) = st.order.pop_first() else {
            break;
        };
        remove(st, &oldest);
    }
}

/// Takes a session out, with the shared pieces only it held.
fn remove(st: &mut State, key: &[u8]) -> Option<Entry> {
    let e = st.entries.remove(key)?;
    st.order.remove(&e.seq);
    e.value.release(&mut st.shared);
    Some(e)
}

enum Record<'a> {
    Put {
        key: &'a [u8],
        value: &'a [u8],
        stored: u64,
    },
    Take {
        key: &'a [u8],
    },
}

impl<'a> Record<'a> {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Record::Put { key, value, stored } => {
                out.push(PUT);
                out.extend_from_slice(&(key.len() as u16).to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(&(value.len() as u32).to_le_bytes());
                out.extend_from_slice(value);
                out.extend_from_slice(&stored.to_le_bytes());
            }
            Record::Take { key } => {
                out.push(TAKE);
                out.extend_from_slice(&(key.len() as u16).to_le_bytes());
                out.extend_from_slice(key);
            }
        }
    }

    /// A record and its length, or `None` if `buf` does not hold a whole valid one.
    fn decode(buf: &'a [u8]) -> Option<(Record<'a>, usize)> {
        let mut r = buf;
        let op = take_n(&mut r, 1)?[0];
        let klen = u16::from_le_bytes(take_n(&mut r, 2)?.try_into().ok()?) as usize;
        let key = take_n(&mut r, klen)?;
        let record = match op {
            PUT => {
                let vlen = u32::from_le_bytes(take_n(&mut r, 4)?.try_into().ok()?) as usize;
                let value = take_n(&mut r, vlen)?;
                let stored = u64::from_le_bytes(take_n(&mut r, 8)?.try_into().ok()?);
                Record::Put { key, value, stored }
            }
            TAKE => Record::Take { key },
            _ => return None,
        };
        Some((record, buf.len() - r.len()))
    }
}

fn take_n<'a>(r: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if r.len() < n {
        return None;
    }
    let (head, tail) = r.split_at(n);
    *r = tail;
    Some(head)
}

impl rustls::server::StoresServerSessions for SessionStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        // The 16/32-bit length fields bound what can be logged.
        if key.len() > usize::from(u16::MAX) || value.len() > u32::MAX as usize {
            return false;
        }
        let stored = now();
        {
            let mut st = self.lock();
            self.append(
                &mut st,
                Record::Put {
                    key: &key,
                    value: &value,
                    stored,
                },
            );
            insert(&mut st, key, &value, stored, self.capacity);
        }
        self.maybe_compact();
        true
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.lock().entries.get(key).map(|e| e.value.bytes())
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut st = self.lock();
        let e = remove(&mut st, key)?;
        // Logged before the session is used: a ticket is never accepted twice,
        // not even across a restart.
        self.append(&mut st, Record::Take { key });
        Some(e.value.bytes())
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::server::StoresServerSessions;
    use std::os::unix::fs::PermissionsExt;

    fn k(i: u8) -> Vec<u8> {
        vec![i; 32]
    }

    #[test]
    fn a_session_is_taken_once() {
        let s = SessionStore::in_memory(10);
        assert!(s.put(k(1), b"one".to_vec()));
        assert_eq!(s.get(&k(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&k(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&k(1)), None, "single use (RFC 8446 §8.1)");
    }

    #[test]
    fn the_oldest_sessions_go_first_beyond_capacity() {
        let s = SessionStore::in_memory(3);
        for i in 0..5 {
            s.put(k(i), vec![i]);
        }
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(&k(1)), None);
        assert_eq!(s.get(&k(2)), Some(vec![2]));
        assert_eq!(s.get(&k(4)), Some(vec![4]));
    }

    #[test]
    fn sessions_and_their_single_use_survive_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        {
            let s = SessionStore::open(&path, 100).unwrap();
            s.put(k(1), b"one".to_vec());
            s.put(k(2), b"two".to_vec());
            s.put(k(3), b"three".to_vec());
            assert!(s.take(&k(2)).is_some());
        }
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let s = SessionStore::open(&path, 100).unwrap();
        assert_eq!(s.len(), 2);
        assert_eq!(s.take(&k(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&k(2)), None, "taken before the restart");
        drop(s);
        let s = SessionStore::open(&path, 100).unwrap();
        assert_eq!(s.take(&k(1)), None, "taken after the first restart");
        assert_eq!(s.take(&k(3)).as_deref(), Some(&b"three"[..]));
    }

    #[test]
    fn stores_of_workers_side_by_side_compact_without_touching_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("sessions.0"), dir.path().join("sessions.1"));
        assert_ne!(temp_path(&a), temp_path(&b));
        // Worker 1 is in the middle of writing its compaction.
        std::fs::write(temp_path(&b), b"worker 1's half-written store").unwrap();
        let s = SessionStore::open(&a, 100).unwrap();
        s.put(k(1), b"zero".to_vec());
        drop(s);
        assert_eq!(
            std::fs::read(temp_path(&b)).unwrap(),
            b"worker 1's half-written store",
            "worker 0's compaction left worker 1's file alone"
        );
        let s = SessionStore::open(&b, 100).unwrap();
        assert!(s.is_empty());
        s.put(k(2), b"one".to_vec());
        drop(s);
        let s = SessionStore::open(&a, 100).unwrap();
        assert_eq!((s.len(), s.get(&k(1)).as_deref()), (1, Some(&b"zero"[..])));
    }

    #[test]
    fn a_torn_last_record_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        {
            let s = SessionStore::open(&path, 100).unwrap();
            s.put(k(1), b"one".to_vec());
            s.put(k(2), b"two".to_vec());
        }
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        let s = SessionStore::open(&path, 100).unwrap();
        assert_eq!(s.len(), 1);
        assert!(s.get(&k(1)).is_some());
    }

    #[test]
    fn expired_sessions_are_dropped_at_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        let mut bytes = MAGIC.to_vec();
        let old = now() - SESSION_LIFETIME_SECS - 10;
        Record::Put {
            key: &k(1),
            value: b"old",
            stored: old,
        }
        .encode(&mut bytes);
        Record::Put {
            key: &k(2),
            value: b"new",
            stored: now(),
        }
        .encode(&mut bytes);
        std::fs::write(&path, bytes).unwrap();
        let s = SessionStore::open(&path, 100).unwrap();
        assert_eq!(s.get(&k(1)), None);
        assert!(s.get(&k(2)).is_some());
    }

    /// A stand-in for a DER certificate: SEQUENCE, two-byte length, `n` bytes.
    fn der(fill: u8, n: u16) -> Vec<u8> {
        let mut v = vec![0x30, 0x82];
        v.extend_from_slice(&n.to_be_bytes());
        v.extend(std::iter::repeat_n(fill, usize::from(n)));
        v
    }

    /// A session value as rustls lays it out: secrets, the certificate, more.
    fn session(secret: u8, cert: &[u8]) -> Vec<u8> {
        [
            vec![secret; 48],
            cert.to_vec(),
            vec![secret, 0x30, 0x82, 0xff],
        ]
        .concat()
    }

    fn shared_pieces(s: &SessionStore) -> usize {
        s.lock().shared.len()
    }

    #[test]
    fn sessions_of_one_switch_keep_its_certificate_once_and_come_back_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        let s = SessionStore::open(&path, 100).unwrap();
        let (a, b) = (der(0xaa, 600), der(0xbb, 700));
        for i in 0..4 {
            assert!(s.put(k(i), session(i, &a)));
        }
        s.put(k(9), session(9, &b));
        // Too short to share, and a header whose length runs past the end.
        s.put(k(10), [der(0xcc, 100), vec![0x30, 0x82, 0x01]].concat());
        assert_eq!(shared_pieces(&s), 2);
        {
            let st = s.lock();
            let held = |key: u8| match &st.entries[&k(key)].value.0[1] {
                Piece::Shared(p) => p.clone(),
                Piece::Own(_) => panic!("the certificate was not shared"),
            };
            assert!(Arc::ptr_eq(&held(0), &held(3)));
        }
        assert_eq!(s.get(&k(1)), Some(session(1, &a)));
        assert_eq!(s.take(&k(0)), Some(session(0, &a)));
        assert_eq!(s.take(&k(9)), Some(session(9, &b)));
        assert_eq!(shared_pieces(&s), 1, "b went with its last session");
        assert_eq!(
            s.get(&k(10)),
            Some([der(0xcc, 100), vec![0x30, 0x82, 0x01]].concat())
        );
        // What the file holds, and rebuilt from it, is the same bytes.
        drop(s);
        let s = SessionStore::open(&path, 100).unwrap();
        assert_eq!(shared_pieces(&s), 1);
        for i in 1..4 {
            assert_eq!(s.take(&k(i)), Some(session(i, &a)));
        }
        assert_eq!(shared_pieces(&s), 0);
        // Evicted sessions let go of their pieces too.
        let s = SessionStore::in_memory(2);
        for i in 0..3 {
            s.put(k(i), session(i, &der(i, 300)));
        }
        assert_eq!(shared_pieces(&s), 2);
    }

    #[test]
    fn a_file_that_is_not_a_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        std::fs::write(&path, b"-----BEGIN PRIVATE KEY-----\n").unwrap();
        let e = SessionStore::open(&path, 100).unwrap_err();
        assert!(e.to_string().contains("not a quicsdn session store"), "{e}");
    }

    #[test]
    fn the_log_is_compacted_when_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sessions");
        let s = SessionStore::open(&path, 100).unwrap();
        for i in 0..3000u32 {
            let key = i.to_le_bytes().to_vec();
            s.put(key.clone(), vec![0; 100]);
            s.take(&key);
        }
        // Without compaction: 3000 puts of ~120 bytes and 3000 takes.
        let size = std::fs::metadata(&path).unwrap().len();
        assert!(size < 3000 * 120 / 2, "{size} bytes");
        drop(s);
        assert!(SessionStore::open(&path, 100).unwrap().is_empty());
    }
}
