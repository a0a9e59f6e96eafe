//! Connection IDs that carry a server id, in the unencrypted form of the
//! QUIC-LB draft (draft-ietf-quic-load-balancers, "CID format": a first
//! octet, the server id, a nonce of at least 4 octets), so that a load
//! balancer in front of several controller-agent hosts, or a reuseport
//! program in front of several controller-agent processes on one port, can
//! route a packet to the agent that owns its connection by its destination
//! connection ID alone, whatever the switch's address (migration, NAT
//! rebinding).
//!
//! Layout (draft "First Octet": config rotation, then length self-description):
//!
//! ```text
//! | config rotation (3 bits) | length - 1 (5 bits) | routing prefix (1..=11) | keyed nonce (8) |
//! ```
//!
//! The routing prefix is the host's server id (`--server-id`, what a
//! balancer routes by) followed by one octet naming the worker process on
//! that host (`--workers`; 0 for a single agent), as the draft's "Load
//! balancer chains" lays out: each tier routes by a longer server id, and a
//! balancer "closer to the client" treats the octet it does not use as part
//! of the nonce. Without `--server-id` the prefix is the worker octet alone.
//! Every agent of one deployment has the same prefix length, so every ID
//! has the same length (the draft's server actions: all servers of a
//! configuration "MUST consistently add the same length").
//!
//! The last 8 octets are quinn's keyed connection ID (a nonce and a check
//! over it), so an agent still recognises the IDs it, or its predecessor
//! with the same key, issued, and answers only those with stateless resets
//! (RFC 9000 §10.3). Agents that share keys are told apart by their prefix:
//! the draft's "Stateless Reset Oracle" needs two packets with one ID to
//! reach two servers sharing a reset key, which routing by server id
//! prevents.

use quinn_proto::{ConnectionId, ConnectionIdGenerator, HashedConnectionIdGenerator, InvalidCid};
use std::time::Duration;

/// The keyed part quinn's generator appends: 8 octets.
const KEYED_LEN: usize = 8;
/// Longest routing prefix that still fits RFC 9000's 20-octet connection ID
/// with the first octet and the keyed part.
pub const MAX_SERVER_ID_LEN: usize = 20 - 1 - KEYED_LEN;
/// Longest host server id (`--server-id`): one octet of the prefix is the
/// worker's.
pub const MAX_HOST_SERVER_ID_LEN: usize = MAX_SERVER_ID_LEN - 1;
/// Draft "Configuration Agent Actions": "The nonce length MUST be at least 4
/// octets."
const MIN_NONCE_LEN: usize = 4;
/// Config rotation codepoint 0b111 is reserved for unroutable IDs (draft §2.3).
pub const MAX_CONFIG_ROTATION: u8 = 6;

/// Why a server id configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerIdError {
    #[error("a server id takes 1 to {MAX_SERVER_ID_LEN} octets, not {0}")]
    Length(usize),
    #[error("the config rotation is 0 to {MAX_CONFIG_ROTATION} (7 marks unroutable IDs), not {0}")]
    Rotation(u8),
    #[error(
        "a server id is 1 to {MAX_HOST_SERVER_ID_LEN} octets in hexadecimal (e.g. 0a or 0a01), \
         not {0:?}"
    )]
    Hex(String),
}

/// A host's server id, as a QUIC-LB balancer's configuration maps it to the
/// host's address: 1 to [`MAX_HOST_SERVER_ID_LEN`] opaque octets (the draft:
/// "server IDs are opaque bytes, not integers"), written in hexadecimal.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerId(Vec<u8>);

impl ServerId {
    pub fn new(octets: &[u8]) -> Result<ServerId, ServerIdError> {
        if octets.is_empty() || octets.len() > MAX_HOST_SERVER_ID_LEN {
            return Err(ServerIdError::Length(octets.len()));
        }
        Ok(ServerId(octets.to_vec()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The routing prefix of worker `index` on a host with this server id
    /// (`None`: a host without one, where the worker octet alone routes).
    pub fn prefix(host: Option<&ServerId>, index: u8) -> Vec<u8> {
        let mut prefix = host.map(|h| h.0.clone()).unwrap_or_default();
        prefix.push(index);
        prefix
    }
}

impl std::str::FromStr for ServerId {
    type Err = ServerIdError;

    fn from_str(text: &str) -> Result<ServerId, ServerIdError> {
        let bad = || ServerIdError::Hex(text.to_string());
        let digits = text.strip_prefix("0x").unwrap_or(text);
        if digits.is_empty()
            || !digits.len().is_multiple_of(2)
            || digits.len() / 2 > MAX_HOST_SERVER_ID_LEN
        {
            return Err(bad());
        }
        let octets = (0..digits.len())
            .step_by(2)
            .map(|i| {
                u8::from_str_radix(digits.get(i..i + 2).ok_or_else(bad)?, 16).map_err(|_| bad())
            })
            .collect::<Result<Vec<u8>, _>>()?;
        ServerId::new(&octets)
    }
}

impl std::fmt::Display for ServerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Issues connection IDs that start with this agent's server id.
pub struct ServerIdCidGenerator {
    first_octet: u8,
    server_id: Vec<u8>,
    keyed: HashedConnectionIdGenerator,
}

impl ServerIdCidGenerator {
    /// `key`: the keyed check's key, shared by every agent behind one address.
    pub fn new(config_rotation: u8, server_id: &[u8], key: u64) -> Result<Self, ServerIdError> {
        if server_id.is_empty() || server_id.len() > MAX_SERVER_ID_LEN {
            return Err(ServerIdError::Length(server_id.len()));
        }
        if config_rotation > MAX_CONFIG_ROTATION {
            return Err(ServerIdError::Rotation(config_rotation));
        }
        let len = 1 + server_id.len() + KEYED_LEN;
        Ok(Self {
            // Draft §2.2: the low 5 bits encode the CID length minus one
            // ("length self-description"), so a balancer need not know it.
            first_octet: (config_rotation << 5) | (len - 1) as u8,
            server_id: server_id.to_vec(),
            keyed: HashedConnectionIdGenerator::from_key(key),
        })
    }
}

impl ConnectionIdGenerator for ServerIdCidGenerator {
    fn generate_cid(&mut self) -> ConnectionId {
        let keyed = self.keyed.generate_cid();
        let mut bytes = Vec::with_capacity(self.cid_len());
        bytes.push(self.first_octet);
        bytes.extend_from_slice(&self.server_id);
        bytes.extend_from_slice(&keyed);
        ConnectionId::new(&bytes)
    }

    /// Ours: our first octet and server id, and the keyed check holds.
    fn validate(&self, cid: &ConnectionId) -> Result<(), InvalidCid> {
        let n = 1 + self.server_id.len();
        if cid.len() != self.cid_len()
            || cid[0] != self.first_octet
            || cid[1..n] != self.server_id[..]
        {
            return Err(InvalidCid);
        }
        self.keyed.validate(&ConnectionId::new(&cid[n..]))
    }

    fn cid_len(&self) -> usize {
        1 + self.server_id.len() + KEYED_LEN
    }

    fn cid_lifetime(&self) -> Option<Duration> {
        None
    }
}

/// What a router configured for `server_id_len`-octet server ids reads from a
/// destination connection ID (`cid`: the ID, or everything after a short
/// header's first octet, whose ID length the first octet self-describes):
/// the config rotation and the server id. Draft "Load Balancer Actions": it
/// "extracts consecutive octets, beginning with the second octet"; whatever
/// follows is nonce to it (also a worker octet it does not use). None for
/// IDs it cannot route (the unroutable codepoint 0b111, a self-described
/// length too short for the server id and a 4-octet nonce, or fewer octets
/// than described), which go to the 4-tuple fallback instead (draft
/// "Unroutable Connection IDs").
pub fn route(cid: &[u8], server_id_len: usize) -> Option<(u8, &[u8])> {
    let first = *cid.first()?;
    let rotation = first >> 5;
    if rotation > MAX_CONFIG_ROTATION {
        return None;
    }
    let len = (first & 0x1f) as usize + 1;
    if len < 1 + server_id_len + MIN_NONCE_LEN || cid.len() < len {
        return None;
    }
    Some((rotation, &cid[1..1 + server_id_len]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_server_id_and_are_recognised_only_by_their_issuer() {
        let mut a = ServerIdCidGenerator::new(1, &[0xa1, 0xa2], 42).unwrap();
        let b = ServerIdCidGenerator::new(1, &[0xb1, 0xb2], 42).unwrap();
        let cid = a.generate_cid();
        assert_eq!(cid.len(), a.cid_len());
        assert_eq!(cid.len(), 11);
        // First octet: rotation 1, length 11 - 1.
        assert_eq!(cid[0], (1 << 5) | 10);
        assert_eq!(route(&cid, 2), Some((1, &[0xa1, 0xa2][..])));
        assert!(a.validate(&cid).is_ok());
        // Another agent behind the same port does not claim it (no reset).
        assert!(b.validate(&cid).is_err());
        // A restarted agent with the same server id and key does.
        let restarted = ServerIdCidGenerator::new(1, &[0xa1, 0xa2], 42).unwrap();
        assert!(restarted.validate(&cid).is_ok());
        // Another key, or a tampered nonce: not ours.
        let rekeyed = ServerIdCidGenerator::new(1, &[0xa1, 0xa2], 43).unwrap();
        assert!(rekeyed.validate(&cid).is_err());
        let mut tampered = cid.to_vec();
        tampered[4] ^= 1;
        assert!(a.validate(&ConnectionId::new(&tampered)).is_err());
        // Fresh nonces: IDs differ.
        assert_ne!(a.generate_cid(), cid);
    }

    #[test]
    fn routing_refuses_what_it_cannot_route() {
        let mut g = ServerIdCidGenerator::new(0, &[7], 1).unwrap();
        let cid = g.generate_cid();
        assert_eq!(route(&cid, 1), Some((0, &[7][..])));
        // A balancer configured for a shorter server id than the prefix reads
        // the rest as nonce (a host's worker octet).
        let mut worker = ServerIdCidGenerator::new(0, &[0x0a, 3], 1).unwrap();
        let cid2 = worker.generate_cid();
        assert_eq!(route(&cid2, 1), Some((0, &[0x0a][..])));
        assert_eq!(route(&cid2, 2), Some((0, &[0x0a, 3][..])));
        // No room for a 4-octet nonce after the server id it expects.
        assert_eq!(route(&cid, 6), None);
        // Unroutable codepoint, truncated, empty.
        let mut unroutable = cid.to_vec();
        unroutable[0] |= 0b111 << 5;
        assert_eq!(route(&unroutable, 1), None);
        assert_eq!(route(&cid[..5], 1), None);
        assert_eq!(route(&[], 1), None);
    }

    #[test]
    fn bad_configurations_are_refused() {
        assert_eq!(
            ServerIdCidGenerator::new(0, &[], 1).err(),
            Some(ServerIdError::Length(0))
        );
        assert_eq!(
            ServerIdCidGenerator::new(0, &[0; 12], 1).err(),
            Some(ServerIdError::Length(12))
        );
        assert_eq!(
            ServerIdCidGenerator::new(7, &[1], 1).err(),
            Some(ServerIdError::Rotation(7))
        );
        for bad in [
            "",
            "0",
            "0g",
            "zz",
            "0x",
            &"ab".repeat(MAX_HOST_SERVER_ID_LEN + 1),
        ] {
            assert_eq!(
                bad.parse::<ServerId>().err(),
                Some(ServerIdError::Hex(bad.to_string())),
                "{bad:?}"
            );
        }
        let id: ServerId = "0x0A01".parse().unwrap();
        assert_eq!(id.as_bytes(), &[0x0a, 0x01]);
        assert_eq!(id.to_string(), "0a01");
        assert_eq!(ServerId::prefix(Some(&id), 3), vec![0x0a, 0x01, 3]);
        assert_eq!(ServerId::prefix(None, 3), vec![3]);
        // The longest host server id and the worker octet fill a 20-octet ID.
        let longest = ServerId::new(&[9; MAX_HOST_SERVER_ID_LEN]).unwrap();
        let prefix = ServerId::prefix(Some(&longest), 0);
        assert_eq!(
            ServerIdCidGenerator::new(0, &prefix, 1)
                .unwrap()
                .generate_cid()
                .len(),
            20
        );
        assert!(ServerId::new(&[9; MAX_SERVER_ID_LEN]).is_err());
        // The longest server id fills a 20-octet ID.
        let mut g = ServerIdCidGenerator::new(6, &[9; MAX_SERVER_ID_LEN], 1).unwrap();
        assert_eq!(g.generate_cid().len(), 20);
    }
}
