//! Connection IDs that carry a server id, in the plaintext form of the QUIC-LB
//! draft (draft-ietf-quic-load-balancers §3, "Plaintext CID Algorithm"), so
//! that a load balancer, or a reuseport program in front of several controller
//! agents on one port, can route a packet to the agent that owns its
//! connection by its destination connection ID alone, whatever the switch's
//! address (migration, NAT rebinding).
//!
//! Layout (draft §2.2, "First Octet"; §3.1):
//!
//! ```text
//! | config rotation (3 bits) | length - 1 (5 bits) | server id (1..=15) | nonce and keyed check (8) |
//! ```
//!
//! The last 8 octets are quinn's keyed connection ID (a nonce and a check
//! over it), so an agent still recognises the IDs it, or its predecessor
//! with the same key, issued, and answers only those with stateless resets
//! (RFC 9000 §10.3). Agents that share a port share that key and the reset
//! key; their server ids tell them apart.
//!
//! Used by the controller agent's workers (`--workers`, [`crate::reuseport`]):
//! one-octet server ids, the worker's index.

use quinn_proto::{ConnectionId, ConnectionIdGenerator, HashedConnectionIdGenerator, InvalidCid};
use std::time::Duration;

/// The keyed part quinn's generator appends: 8 octets.
const KEYED_LEN: usize = 8;
/// Longest server id that still fits RFC 9000's 20-octet connection ID with
/// the first octet and the keyed part.
pub const MAX_SERVER_ID_LEN: usize = 20 - 1 - KEYED_LEN;
/// Config rotation codepoint 0b111 is reserved for unroutable IDs (draft §2.3).
pub const MAX_CONFIG_ROTATION: u8 = 6;

/// Why a server id configuration is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServerIdError {
    #[error("a server id takes 1 to {MAX_SERVER_ID_LEN} octets, not {0}")]
    Length(usize),
    #[error("the config rotation is 0 to {MAX_CONFIG_ROTATION} (7 marks unroutable IDs), not {0}")]
    Rotation(u8),
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

/// What a router does with a short-header packet's destination connection ID:
/// the config rotation and the server id, for a configuration whose server ids
/// are `server_id_len` octets. None for IDs it cannot route (too short, the
/// unroutable codepoint, or a length that does not match), which go to the
/// 4-tuple hash instead (draft §4).
pub fn route(cid: &[u8], server_id_len: usize) -> Option<(u8, &[u8])> {
    let first = *cid.first()?;
    let rotation = first >> 5;
    if rotation > MAX_CONFIG_ROTATION {
        return None;
    }
    let len = (first & 0x1f) as usize + 1;
    if len != 1 + server_id_len + KEYED_LEN || cid.len() < len {
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
        // Configured for another server id length: the length octet disagrees.
        assert_eq!(route(&cid, 2), None);
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
        // The longest server id fills a 20-octet ID.
        let mut g = ServerIdCidGenerator::new(6, &[9; MAX_SERVER_ID_LEN], 1).unwrap();
        assert_eq!(g.generate_cid().len(), 20);
    }
}
