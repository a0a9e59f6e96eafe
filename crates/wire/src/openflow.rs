//! OpenFlow headers and message types, for every wire version quicsdn may carry.
//!
//! OpenFlow 1.3.5 §7.1: every message begins with `struct ofp_header { uint8_t version;
//! uint8_t type; uint16_t length; uint32_t xid; }`, where "length" is the "length
//! including this ofp_header". The header layout is the same in every version
//! (1.0 through 1.5), which is what lets the agents frame any version without
//! negotiating one. quicsdn never rewrites a message; it only reads headers to find
//! boundaries and to name what it forwards in logs and scheduling.

pub mod build;
pub mod fields;
pub mod hello;

/// Size of `struct ofp_header` (OpenFlow 1.3.5 §7.1: `OFP_ASSERT(sizeof(struct ofp_header) == 8)`).
pub const HEADER_LEN: usize = 8;
/// The `length` field is 16 bits, so no OpenFlow message exceeds this.
pub const MAX_MESSAGE_LEN: usize = u16::MAX as usize;

/// Wire version numbers (`ofp_version`).
pub const OFP10_VERSION: u8 = 0x01;
pub const OFP11_VERSION: u8 = 0x02;
pub const OFP12_VERSION: u8 = 0x03;
pub const OFP13_VERSION: u8 = 0x04;
pub const OFP14_VERSION: u8 = 0x05;
pub const OFP15_VERSION: u8 = 0x06;

/// A decoded `ofp_header`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub msg_type: u8,
    pub length: u16,
    pub xid: u32,
}

impl Header {
    /// Reads the header at the start of `buf`, if 8 bytes are there.
    pub fn parse(buf: &[u8]) -> Option<Header> {
        let h: &[u8; HEADER_LEN] = buf.get(..HEADER_LEN)?.try_into().ok()?;
        Some(Header {
            version: h[0],
            msg_type: h[1],
            length: u16::from_be_bytes([h[2], h[3]]),
            xid: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        })
    }

    /// Encodes the header (for tests and synthetic peers; the agents never build messages).
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0] = self.version;
        out[1] = self.msg_type;
        out[2..4].copy_from_slice(&self.length.to_be_bytes());
        out[4..8].copy_from_slice(&self.xid.to_be_bytes());
        out
    }

    /// The message's kind, normalised across versions.
    pub fn kind(&self) -> Kind {
        Kind::of(self.version, self.msg_type)
    }
}

/// Message kinds, normalised across OpenFlow versions.
///
/// OpenFlow 1.0 numbers some types differently from 1.1+ (1.0 has no GROUP_MOD or
/// TABLE_MOD, so PORT_MOD is 15 there and 16 later; STATS_* became MULTIPART_* in
/// 1.3 with the same numbers as 1.1's STATS_*). [`Kind::of`] resolves that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Hello,
    Error,
    EchoRequest,
    EchoReply,
    Experimenter,
    FeaturesRequest,
    FeaturesReply,
    GetConfigRequest,
    GetConfigReply,
    SetConfig,
    PacketIn,
    FlowRemoved,
    PortStatus,
    PacketOut,
    FlowMod,
    GroupMod,
    PortMod,
    TableMod,
    /// MULTIPART_REQUEST (1.3+), STATS_REQUEST (1.0–1.2).
    MultipartRequest,
    /// MULTIPART_REPLY (1.3+), STATS_REPLY (1.0–1.2).
    MultipartReply,
    BarrierRequest,
    BarrierReply,
    QueueGetConfigRequest,
    QueueGetConfigReply,
    RoleRequest,
    RoleReply,
    GetAsyncRequest,
    GetAsyncReply,
    SetAsync,
    MeterMod,
    RoleStatus,
    TableStatus,
    RequestForward,
    BundleControl,
    BundleAddMessage,
    ControllerStatus,
    /// A type number this version does not define (forwarded all the same).
    Unknown(u8),
}

impl Kind {
    /// Classifies `msg_type` for wire `version`. Versions newer than 1.5 are read
    /// with 1.5's numbering, which later versions are expected to extend.
    pub fn of(version: u8, msg_type: u8) -> Kind {
        use Kind::*;
        // Types 0..=13 mean the same in every version.
        const COMMON: [Kind; 14] = [
            Hello,
            Error,
            EchoRequest,
            EchoReply,
            Experimenter,
            FeaturesRequest,
            FeaturesReply,
            GetConfigRequest,
            GetConfigReply,
            SetConfig,
            PacketIn,
            FlowRemoved,
            PortStatus,
            PacketOut,
        ];
        if let Some(&k) = COMMON.get(usize::from(msg_type)) {
            return k;
        }
        if version == OFP10_VERSION {
            // OpenFlow 1.0.0 §5.1 `enum ofp_type`.
            return match msg_type {
                14 => FlowMod,
                15 => PortMod,
                16 => MultipartRequest,
                17 => MultipartReply,
                18 => BarrierRequest,
                19 => BarrierReply,
                20 => QueueGetConfigRequest,
                21 => QueueGetConfigReply,
                t => Unknown(t),
            };
        }
        // OpenFlow 1.3.5 §7.1 / 1.5.1 §7.1 `enum ofp_type`; each version only
        // appends, so the highest number a version defines bounds the table.
        let highest = match version {
            OFP11_VERSION => 23,
            OFP12_VERSION => 25,
            OFP13_VERSION => 29,
            OFP14_VERSION => 34,
            _ => 35,
        };
        if msg_type > highest {
            return Unknown(msg_type);
        }
        match msg_type {
            14 => FlowMod,
            15 => GroupMod,
            16 => PortMod,
            17 => TableMod,
            18 => MultipartRequest,
            19 => MultipartReply,
            20 => BarrierRequest,
            21 => BarrierReply,
            22 => QueueGetConfigRequest,
            23 => QueueGetConfigReply,
            24 => RoleRequest,
            25 => RoleReply,
            26 => GetAsyncRequest,
            27 => GetAsyncReply,
            28 => SetAsync,
            29 => MeterMod,
            30 => RoleStatus,
            31 => TableStatus,
            32 => RequestForward,
            33 => BundleControl,
            34 => BundleAddMessage,
            35 => ControllerStatus,
            t => Unknown(t),
        }
    }

    /// The OpenFlow constant's name without its `OFPT_` prefix, for logs.
    pub fn name(self) -> &'static str {
        use Kind::*;
        match self {
            Hello => "HELLO",
            Error => "ERROR",
            EchoRequest => "ECHO_REQUEST",
            EchoReply => "ECHO_REPLY",
            Experimenter => "EXPERIMENTER",
            FeaturesRequest => "FEATURES_REQUEST",
            FeaturesReply => "FEATURES_REPLY",
            GetConfigRequest => "GET_CONFIG_REQUEST",
            GetConfigReply => "GET_CONFIG_REPLY",
            SetConfig => "SET_CONFIG",
            PacketIn => "PACKET_IN",
            FlowRemoved => "FLOW_REMOVED",
            PortStatus => "PORT_STATUS",
            PacketOut => "PACKET_OUT",
            FlowMod => "FLOW_MOD",
            GroupMod => "GROUP_MOD",
            PortMod => "PORT_MOD",
            TableMod => "TABLE_MOD",
            MultipartRequest => "MULTIPART_REQUEST",
            MultipartReply => "MULTIPART_REPLY",
            BarrierRequest => "BARRIER_REQUEST",
            BarrierReply => "BARRIER_REPLY",
            QueueGetConfigRequest => "QUEUE_GET_CONFIG_REQUEST",
            QueueGetConfigReply => "QUEUE_GET_CONFIG_REPLY",
            RoleRequest => "ROLE_REQUEST",
            RoleReply => "ROLE_REPLY",
            GetAsyncRequest => "GET_ASYNC_REQUEST",
            GetAsyncReply => "GET_ASYNC_REPLY",
            SetAsync => "SET_ASYNC",
            MeterMod => "METER_MOD",
            RoleStatus => "ROLE_STATUS",
            TableStatus => "TABLE_STATUS",
            RequestForward => "REQUESTFORWARD",
            BundleControl => "BUNDLE_CONTROL",
            BundleAddMessage => "BUNDLE_ADD_MESSAGE",
            ControllerStatus => "CONTROLLER_STATUS",
            Unknown(_) => "UNKNOWN",
        }
    }
}

/// Builds a whole message with the given header fields and body (tests, synthetic
/// peers and benchmarks; the agents forward what they receive and build nothing).
pub fn message(version: u8, kind_code: u8, xid: u32, body: &[u8]) -> Vec<u8> {
    let length = HEADER_LEN + body.len();
    assert!(
        length <= MAX_MESSAGE_LEN,
        "OpenFlow message of {length} bytes"
    );
    let header = Header {
        version,
        msg_type: kind_code,
        length: length as u16,
        xid,
    };
    let mut out = Vec::with_capacity(length);
    out.extend_from_slice(&header.encode());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trip() {
        let h = Header {
            version: OFP13_VERSION,
            msg_type: 19,
            length: 65_535,
            xid: 0xdead_beef,
        };
        assert_eq!(Header::parse(&h.encode()), Some(h));
        assert_eq!(Header::parse(&h.encode()[..7]), None);
    }

    #[test]
    fn kinds_follow_each_versions_numbering() {
        // PORT_MOD is 15 in 1.0 but 16 from 1.1 on; 15 is GROUP_MOD there.
        assert_eq!(Kind::of(OFP10_VERSION, 15), Kind::PortMod);
        assert_eq!(Kind::of(OFP13_VERSION, 15), Kind::GroupMod);
        assert_eq!(Kind::of(OFP10_VERSION, 18), Kind::BarrierRequest);
        assert_eq!(Kind::of(OFP13_VERSION, 20), Kind::BarrierRequest);
        assert_eq!(Kind::of(OFP13_VERSION, 19), Kind::MultipartReply);
        assert_eq!(Kind::of(OFP10_VERSION, 17), Kind::MultipartReply);
        // Types a version does not define are Unknown, not misnamed.
        assert_eq!(Kind::of(OFP10_VERSION, 22), Kind::Unknown(22));
        assert_eq!(Kind::of(OFP13_VERSION, 30), Kind::Unknown(30));
        assert_eq!(Kind::of(OFP14_VERSION, 30), Kind::RoleStatus);
        assert_eq!(Kind::of(OFP15_VERSION, 35), Kind::ControllerStatus);
        assert_eq!(Kind::of(OFP15_VERSION, 36), Kind::Unknown(36));
        assert_eq!(Kind::of(OFP13_VERSION, 2).name(), "ECHO_REQUEST");
    }
}
