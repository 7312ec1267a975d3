//! Wire format of the vfio-user protocol: header, commands and the fixed
//! parts of each message, decoded from and encoded to little-endian bytes
//! field by field (no transmutes of peer-supplied bytes).

use std::fmt;

/// Size of the header that starts every message.
pub const HEADER_SIZE: usize = 16;

/// Largest data payload of one region or DMA read/write this server accepts
/// and advertises (`max_data_xfer_size`).
pub const MAX_DATA_XFER_SIZE: u32 = 1 << 20;

/// Largest whole message accepted: a maximal transfer plus its fixed fields,
/// rounded up generously. Anything larger is a protocol violation.
pub const MAX_MESSAGE_SIZE: u32 = MAX_DATA_XFER_SIZE + 4096;

/// Most file descriptors accepted with one message (`max_msg_fds`).
pub const MAX_MSG_FDS: usize = 16;

/// Default for a peer that does not state `max_msg_fds`.
pub const DEFAULT_PEER_MAX_MSG_FDS: usize = 1;

/// Default `max_dma_maps` when the client states none.
pub const DEFAULT_MAX_DMA_MAPS: u32 = 65535;

/// The only page size the DMA map table supports.
pub const PAGE_SIZE: u64 = 4096;

/// Message type: command.
pub const FLAG_TYPE_COMMAND: u32 = 0x0;
/// Message type: reply.
pub const FLAG_TYPE_REPLY: u32 = 0x1;
/// Mask of the type bits.
pub const FLAG_TYPE_MASK: u32 = 0xf;
/// The sender wants no reply.
pub const FLAG_NO_REPLY: u32 = 1 << 4;
/// The reply reports an error; `error` holds the errno.
pub const FLAG_ERROR: u32 = 1 << 5;

/// DMA_MAP flags.
pub const DMA_FLAG_READ: u32 = 1 << 0;
/// DMA_MAP flags.
pub const DMA_FLAG_WRITE: u32 = 1 << 1;
/// DMA_UNMAP flag asking for dirty-page data, which this server does not track.
pub const DMA_UNMAP_FLAG_GET_DIRTY_BITMAP: u32 = 1 << 0;
/// DMA_UNMAP flag removing every mapping (Linux `VFIO_DMA_UNMAP_FLAG_ALL`).
pub const DMA_UNMAP_FLAG_ALL: u32 = 1 << 1;

/// Declares [`Command`] and its decoder from one list of numbers.
macro_rules! commands {
    ($($(#[$doc:meta])* $name:ident = $num:literal,)*) => {
        /// Commands of protocol version 0.x.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        #[repr(u16)]
        pub enum Command {
            $($(#[$doc])* $name = $num,)*
        }

        impl Command {
            /// Decodes a command number; `None` for numbers the protocol
            /// does not define.
            pub fn from_u16(value: u16) -> Option<Self> {
                match value {
                    $($num => Some(Self::$name),)*
                    _ => None,
                }
            }
        }
    };
}

commands! {
    /// Version and capability negotiation.
    Version = 1,
    /// Add a DMA region.
    DmaMap = 2,
    /// Remove DMA regions.
    DmaUnmap = 3,
    /// Device flags and counts.
    DeviceGetInfo = 4,
    /// One region's size, flags and capabilities.
    DeviceGetRegionInfo = 5,
    /// ioeventfds for parts of a region.
    DeviceGetRegionIoFds = 6,
    /// One interrupt type's count and flags.
    DeviceGetIrqInfo = 7,
    /// Interrupt actions.
    DeviceSetIrqs = 8,
    /// Read from a region.
    RegionRead = 9,
    /// Write to a region.
    RegionWrite = 10,
    /// Server reads client memory.
    DmaRead = 11,
    /// Server writes client memory.
    DmaWrite = 12,
    /// Reset the device.
    DeviceReset = 13,
    /// Several small writes in one message.
    RegionWriteMulti = 15,
    /// Device features (migration); not offered.
    DeviceFeature = 16,
    /// Migration data; not offered.
    MigDataRead = 17,
    /// Migration data; not offered.
    MigDataWrite = 18,
}

/// The 16-byte message header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Header {
    /// Sender-chosen id, echoed in the reply.
    pub msg_id: u16,
    /// Raw command number.
    pub command: u16,
    /// Size of the whole message, header included.
    pub msg_size: u32,
    /// Type, no-reply and error bits.
    pub flags: u32,
    /// errno of an error reply.
    pub error: u32,
}

impl Header {
    /// Decodes a header from exactly [`HEADER_SIZE`] bytes.
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Self {
        let mut r = Reader::new(bytes);
        // The reader cannot run short: the array has exactly the header's size.
        Header {
            msg_id: r.u16().unwrap_or_default(),
            command: r.u16().unwrap_or_default(),
            msg_size: r.u32().unwrap_or_default(),
            flags: r.u32().unwrap_or_default(),
            error: r.u32().unwrap_or_default(),
        }
    }

    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut out = [0u8; HEADER_SIZE];
        out[0..2].copy_from_slice(&self.msg_id.to_le_bytes());
        out[2..4].copy_from_slice(&self.command.to_le_bytes());
        out[4..8].copy_from_slice(&self.msg_size.to_le_bytes());
        out[8..12].copy_from_slice(&self.flags.to_le_bytes());
        out[12..16].copy_from_slice(&self.error.to_le_bytes());
        out
    }

    /// The type bits.
    pub fn msg_type(&self) -> u32 {
        self.flags & FLAG_TYPE_MASK
    }

    /// Whether this is a reply.
    pub fn is_reply(&self) -> bool {
        self.msg_type() == FLAG_TYPE_REPLY
    }

    /// Whether the sender asked for no reply.
    pub fn no_reply(&self) -> bool {
        self.flags & FLAG_NO_REPLY != 0
    }
}

/// A payload was shorter than its fixed fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Truncated;

impl fmt::Display for Truncated {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "payload shorter than its fixed fields")
    }
}

/// Cursor over a payload that decodes little-endian integers.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], Truncated> {
        let end = self.pos.checked_add(N).ok_or(Truncated)?;
        let bytes = self.buf.get(self.pos..end).ok_or(Truncated)?;
        self.pos = end;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    /// Next `u16`.
    pub fn u16(&mut self) -> Result<u16, Truncated> {
        self.take::<2>().map(u16::from_le_bytes)
    }

    /// Next `u32`.
    pub fn u32(&mut self) -> Result<u32, Truncated> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    /// Next `u64`.
    pub fn u64(&mut self) -> Result<u64, Truncated> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    /// Everything not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.pos.min(self.buf.len())..]
    }
}

/// Appends little-endian fields to a reply payload.
#[derive(Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty payload with room for `capacity` bytes.
    pub fn with_capacity(capacity: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(capacity),
        }
    }

    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(v);
        self
    }

    /// The payload built so far.
    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }
}

/// Capabilities a peer sent with VERSION, with the spec's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerCaps {
    /// Most fds the peer accepts in one message.
    pub max_msg_fds: usize,
    /// Largest read/write the peer accepts.
    pub max_data_xfer_size: u32,
    /// Most simultaneous DMA maps.
    pub max_dma_maps: u32,
    /// Page sizes supported for DMA maps.
    pub pgsizes: u64,
    /// Whether REGION_WRITE_MULTI was offered.
    pub write_multiple: bool,
}

impl Default for PeerCaps {
    fn default() -> Self {
        PeerCaps {
            max_msg_fds: DEFAULT_PEER_MAX_MSG_FDS,
            max_data_xfer_size: MAX_DATA_XFER_SIZE,
            max_dma_maps: DEFAULT_MAX_DMA_MAPS,
            pgsizes: PAGE_SIZE,
            write_multiple: false,
        }
    }
}

/// Why a VERSION capability string was refused.
#[derive(Debug, thiserror::Error)]
pub enum CapsError {
    /// The version data does not end with NUL.
    #[error("version data is not NUL-terminated")]
    NotTerminated,
    /// The JSON does not parse or has fields of the wrong type.
    #[error("version data is not valid capability JSON")]
    Json(#[source] serde_json::Error),
    /// A field is out of range.
    #[error("capability {0} is out of range")]
    Range(&'static str),
}

#[derive(serde::Deserialize, Default)]
struct CapsJson {
    #[serde(default)]
    capabilities: Option<CapsInner>,
}

#[derive(serde::Deserialize, Default)]
struct CapsInner {
    max_msg_fds: Option<u64>,
    max_data_xfer_size: Option<u64>,
    max_dma_maps: Option<u64>,
    pgsizes: Option<u64>,
    write_multiple: Option<bool>,
}

impl PeerCaps {
    /// Parses the optional JSON version data (NUL-terminated) of a VERSION
    /// message. Unknown capabilities (migration, twin_socket) are ignored,
    /// which declines them.
    pub fn parse(data: &[u8]) -> Result<Self, CapsError> {
        let mut caps = PeerCaps::default();
        if data.is_empty() {
            return Ok(caps);
        }
        let (last, json) = data.split_last().ok_or(CapsError::NotTerminated)?;
        if *last != 0 {
            return Err(CapsError::NotTerminated);
        }
        // Some clients pad with extra NULs; tolerate them.
        let json = match json.iter().position(|b| *b == 0) {
            Some(end) => &json[..end],
            None => json,
        };
        let parsed: CapsJson = serde_json::from_slice(json).map_err(CapsError::Json)?;
        let Some(inner) = parsed.capabilities else {
            return Ok(caps);
        };
        if let Some(v) = inner.max_msg_fds {
            if v == 0 || v > 1024 {
                return Err(CapsError::Range("max_msg_fds"));
            }
            caps.max_msg_fds = v as usize;
        }
        if let Some(v) = inner.max_data_xfer_size {
            if v == 0 || v > u64::from(u32::MAX) {
                return Err(CapsError::Range("max_data_xfer_size"));
            }
            caps.max_data_xfer_size = v as u32;
        }
        if let Some(v) = inner.max_dma_maps {
            if v == 0 || v > u64::from(u32::MAX) {
                return Err(CapsError::Range("max_dma_maps"));
            }
            caps.max_dma_maps = v as u32;
        }
        if let Some(v) = inner.pgsizes {
            caps.pgsizes = v;
        }
        caps.write_multiple = inner.write_multiple.unwrap_or(false);
        Ok(caps)
    }
}

/// The capabilities this server answers with: its own limits, never above
/// what the client proposed, and only capabilities the client offered.
pub fn reply_caps_json(client: &PeerCaps) -> String {
    let mut caps = serde_json::Map::new();
    caps.insert("max_msg_fds".into(), (MAX_MSG_FDS as u64).into());
    caps.insert(
        "max_data_xfer_size".into(),
        u64::from(MAX_DATA_XFER_SIZE.min(client.max_data_xfer_size)).into(),
    );
    caps.insert(
        "max_dma_maps".into(),
        u64::from(DEFAULT_MAX_DMA_MAPS.min(client.max_dma_maps)).into(),
    );
    caps.insert("pgsizes".into(), PAGE_SIZE.into());
    if client.write_multiple {
        caps.insert("write_multiple".into(), true.into());
    }
    let mut root = serde_json::Map::new();
    root.insert("capabilities".into(), caps.into());
    serde_json::Value::Object(root).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_header_roundtrip() {
        let h = Header {
            msg_id: 0x1234,
            command: 10,
            msg_size: 40,
            flags: FLAG_TYPE_REPLY | FLAG_ERROR,
            error: 22,
        };
        assert_eq!(Header::decode(&h.encode()), h);
        assert!(h.is_reply());
        assert!(!h.no_reply());
    }

    #[test]
    fn test_command_unknown_numbers_are_none() {
        assert_eq!(Command::from_u16(0), None);
        assert_eq!(Command::from_u16(14), None);
        assert_eq!(Command::from_u16(19), None);
        assert_eq!(Command::from_u16(15), Some(Command::RegionWriteMulti));
    }

    #[test]
    fn test_reader_truncated() {
        let mut r = Reader::new(&[1, 0, 0]);
        assert_eq!(r.u16(), Ok(1));
        assert_eq!(r.u16(), Err(Truncated));
        assert_eq!(r.rest(), &[0]);
    }

    #[test]
    fn test_caps_qemu_style() {
        let json = br#"{"capabilities":{"max_msg_fds":16,"max_data_xfer_size":1048576,"pgsizes":4096,"max_dma_maps":65535,"migration":{"pgsize":4096,"max_bitmap_size":1048576},"write_multiple":true}}"#;
        let mut data = json.to_vec();
        data.push(0);
        let caps = PeerCaps::parse(&data).unwrap();
        assert_eq!(caps.max_msg_fds, 16);
        assert!(caps.write_multiple);
        let reply = reply_caps_json(&caps);
        assert!(reply.contains("\"write_multiple\":true"));
    }

    #[test]
    fn test_caps_invalid() {
        assert!(matches!(
            PeerCaps::parse(b"{}"),
            Err(CapsError::NotTerminated)
        ));
        assert!(matches!(
            PeerCaps::parse(b"{nope\0"),
            Err(CapsError::Json(_))
        ));
        assert!(matches!(
            PeerCaps::parse(b"{\"capabilities\":{\"max_msg_fds\":0}}\0"),
            Err(CapsError::Range("max_msg_fds"))
        ));
        assert!(matches!(
            PeerCaps::parse(b"{\"capabilities\":{\"max_msg_fds\":\"x\"}}\0"),
            Err(CapsError::Json(_))
        ));
    }

    #[test]
    fn test_caps_defaults_and_smaller_client_limits() {
        let caps = PeerCaps::parse(b"{\"capabilities\":{\"max_data_xfer_size\":4096}}\0").unwrap();
        assert_eq!(caps.max_msg_fds, 1);
        let reply = reply_caps_json(&caps);
        assert!(reply.contains("\"max_data_xfer_size\":4096"));
        assert!(!reply.contains("write_multiple"));
    }
}
