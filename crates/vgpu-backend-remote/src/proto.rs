//! The partition host protocol: length-prefixed binary frames on a UNIX
//! stream socket, one request at a time.
//!
//! Every frame is a 16-byte header followed by `len` payload bytes, all
//! little-endian:
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `"VGPH"` |
//! | 4..6 | protocol version ([`VERSION`]) |
//! | 6..8 | kind ([`Kind`]; a reply sets [`REPLY`]) |
//! | 8..12 | sequence number of the request (a reply repeats it) |
//! | 12..16 | payload length |
//!
//! The parent sends a request and reads frames until the reply of the same
//! kind and sequence number arrives. While an upload or download is in
//! progress the host may instead send a [`Kind::Need`] or [`Kind::Out`]
//! callback (fill or drain the shared staging area), which the parent
//! answers before it reads on. Nothing else may arrive.
//!
//! Bulk data never travels in frames: it crosses through a memfd staging
//! area mapped by both processes, passed with `SCM_RIGHTS` on
//! [`Kind::Create`]. Module images and launch parameters travel inline and
//! are bounded by the guest ABI's limits.
//!
//! A reply starts with a status byte (0 = success, else an [`OpError`]
//! code) and the partition's memory in use, then the kind's result or the
//! error's fields. Decoders refuse anything malformed: wrong magic,
//! version, kind or sequence, a length over the bound for that direction,
//! unknown codes, over-long text, trailing bytes. The parent treats the
//! host as less trusted than itself (it runs guest kernels on a GPU), so
//! a refused reply ends that host.
//!
//! Guest memory that the daemon maps from the VMM's files travels to the
//! host as the file itself: [`Kind::Control`] hands the host a second
//! socket, on which the daemon announces mappings ([`Kind::Map`], the
//! file passed with `SCM_RIGHTS`) and their end ([`Kind::Unmap`]), each
//! answered by a status-only reply. Uploads and downloads between device
//! memory and such mappings ([`Kind::UploadMapped`],
//! [`Kind::DownloadMapped`], and the copies of a [`Kind::Queued`] run)
//! name the pieces as (mapping, offset, length) and move no bytes through
//! the staging area.

use vgpu_abi as abi;
use vgpu_backend::console::ConsoleText;
use vgpu_backend::vmm::VmmOp;
use vgpu_backend::{
    Capacity, DeviceCopy, DeviceFill, Finished, FunctionInfo, Launch, OpError, QueuedDone,
    MAX_QUEUED_STEPS,
};

/// `"VGPH"`.
pub const MAGIC: u32 = u32::from_le_bytes(*b"VGPH");
/// The protocol version; parent and host must agree exactly (they ship
/// together).
pub const VERSION: u16 = 8;
/// Most runs started and not yet finished ([`Kind::Start`]), all lanes
/// together.
pub const MAX_STARTED: usize = 8;
/// Most lanes a started run may name.
pub const MAX_LANES: u32 = 16;
/// Header bytes.
pub const HEADER_LEN: usize = 16;
/// Set in the kind of a reply.
pub const REPLY: u16 = 0x8000;
/// Longest entry point name.
pub const MAX_ENTRY: usize = abi::MAX_ENTRY_NAME as usize;
/// Longest partition or backend name.
pub const MAX_NAME: usize = 256;
/// Longest error text carried in a reply (longer text is cut).
pub const MAX_TEXT: usize = 1024;
/// Largest request payload: a module image of the ABI's largest size plus
/// its fixed fields.
pub const MAX_REQUEST: u32 = abi::MAX_MODULE_SIZE as u32 + 64;
/// Largest payload the host may send: replies and callbacks are small,
/// the largest being a kernel's description or the results of queued
/// steps that all failed with a message.
pub const MAX_REPLY: u32 = {
    let function = 64 + abi::MAX_FUNC_PARAMS * 8 + MAX_TEXT as u32;
    let queued = 16 + MAX_QUEUED_STEPS as u32 * (11 + MAX_TEXT as u32);
    let console = 32 + MAX_CONSOLE as u32;
    let most = if function > queued { function } else { queued };
    if most > console {
        most
    } else {
        console
    }
};
/// Most printed output one [`Kind::Console`] reply carries.
pub const MAX_CONSOLE: usize = 64 << 10;
/// Largest resource request (a guest command of ABI 1.6).
pub const MAX_RESOURCE: usize = 128;
/// Most pieces of one transfer through forwarded mappings; more take the
/// staging area. A request of this many fits a mailbox slot.
pub const MAX_PIECES: usize = 256;
/// Largest payload on the memory control socket.
pub const MAX_CONTROL: u32 = 64;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Version check; the reply names the host's backend and capacity.
    Hello = 1,
    /// Creates the host's one partition; carries the staging memfd. The
    /// reply is the partition's kernel compute units.
    Create = 2,
    /// `Partition::alloc`.
    Alloc = 3,
    /// `Partition::free`.
    Free = 4,
    /// `Partition::upload` through the staging area.
    Upload = 5,
    /// `Partition::download` through the staging area.
    Download = 6,
    /// `Partition::copy`.
    Copy = 7,
    /// `Partition::fill`.
    Fill = 8,
    /// `Partition::module_load`, image inline.
    ModuleLoad = 9,
    /// `Partition::module_unload`.
    ModuleUnload = 10,
    /// `Partition::launch`, parameters inline.
    Launch = 11,
    /// `Partition::reset`.
    Reset = 12,
    /// Control socket: guest memory to map (its file travels beside it).
    Map = 13,
    /// Control socket: a mapping ends; the reply says it is unmapped.
    Unmap = 14,
    /// Hands the host its memory control socket (beside it).
    Control = 15,
    /// `Partition::upload` from forwarded mappings.
    UploadMapped = 16,
    /// `Partition::download` into forwarded mappings.
    DownloadMapped = 17,
    /// `Partition::function_info`.
    FunctionInfo = 18,
    /// `Partition::global_info`.
    GlobalInfo = 19,
    /// `Partition::run_queued`, launch parameters inline, copies as
    /// pieces of mappings (all one way).
    Queued = 20,
    /// `Partition::max_active_clusters`.
    Occupancy = 21,
    /// `Partition::console`, at most [`MAX_CONSOLE`] bytes a reply.
    Console = 22,
    /// `Partition::start_queued`: a run as [`Kind::Queued`] carries it,
    /// answered as soon as the host has taken it, with the results of the
    /// started runs that are done by then.
    Start = 23,
    /// `Partition::finish_queued`: the results of the oldest started run.
    Finish = 24,
    /// `Partition::vmm`: a virtual memory request (protocol 7).
    Vmm = 25,
    /// `Partition::resource`: the guest's command inline.
    Resource = 26,
    /// `Partition::set_memory` (protocol 8). Answered without waiting for
    /// the runs started before it.
    SetMemory = 27,
    /// `Partition::suspend` (protocol 8).
    Suspend = 28,
    /// `Partition::resume` (protocol 8).
    Resume = 29,
    /// Host -> parent during an upload: put `[offset, offset + len)` of the
    /// source at byte `at` of the staging area.
    Need = 0x40,
    /// Host -> parent during a download: byte `at` of the staging area
    /// holds `[offset, offset + len)` of the result.
    Out = 0x41,
}

impl Kind {
    /// The kind of a raw value (without [`REPLY`]).
    pub fn from_raw(v: u16) -> Option<Kind> {
        use Kind::*;
        Some(match v {
            1 => Hello,
            2 => Create,
            3 => Alloc,
            4 => Free,
            5 => Upload,
            6 => Download,
            7 => Copy,
            8 => Fill,
            9 => ModuleLoad,
            10 => ModuleUnload,
            11 => Launch,
            12 => Reset,
            13 => Map,
            14 => Unmap,
            15 => Control,
            16 => UploadMapped,
            17 => DownloadMapped,
            18 => FunctionInfo,
            19 => GlobalInfo,
            20 => Queued,
            21 => Occupancy,
            22 => Console,
            23 => Start,
            24 => Finish,
            25 => Vmm,
            26 => Resource,
            27 => SetMemory,
            28 => Suspend,
            29 => Resume,
            0x40 => Need,
            0x41 => Out,
            _ => return None,
        })
    }
}

/// A frame that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    /// Not our magic.
    #[error("bad magic {0:#010x}")]
    Magic(u32),
    /// Another protocol version.
    #[error("protocol version {0}, expected {VERSION}")]
    Version(u16),
    /// Unknown or unexpected kind.
    #[error("unexpected frame kind {0:#06x}")]
    Kind(u16),
    /// Not the sequence number asked about.
    #[error("sequence number {got}, expected {expected}")]
    Sequence {
        /// In the frame.
        got: u32,
        /// Expected.
        expected: u32,
    },
    /// Payload longer than allowed.
    #[error("payload of {len} bytes exceeds {max}")]
    TooLong {
        /// In the header.
        len: u32,
        /// The bound.
        max: u32,
    },
    /// Payload shorter than its fields, or with bytes left over.
    #[error("malformed payload: {0}")]
    Malformed(&'static str),
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Kind, with [`REPLY`] if set.
    pub kind: u16,
    /// Sequence number.
    pub seq: u32,
    /// Payload length.
    pub len: u32,
}

impl Header {
    /// Encodes the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..16].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes and checks a header whose payload may be at most `max` bytes.
    pub fn decode(b: &[u8; HEADER_LEN], max: u32) -> Result<Header, ProtoError> {
        let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let magic = word(0);
        if magic != MAGIC {
            return Err(ProtoError::Magic(magic));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION {
            return Err(ProtoError::Version(version));
        }
        let h = Header {
            kind: u16::from_le_bytes([b[6], b[7]]),
            seq: word(8),
            len: word(12),
        };
        if h.len > max {
            return Err(ProtoError::TooLong { len: h.len, max });
        }
        Ok(h)
    }
}

/// Builds a payload.
#[derive(Debug, Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends a u16.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u32.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u64.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a u16 length and at most `max` bytes of `s` (cut at a
    /// character boundary).
    pub fn text(&mut self, s: &str, max: usize) -> &mut Self {
        let mut end = s.len().min(max);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        self.u16(end as u16);
        self.0.extend_from_slice(&s.as_bytes()[..end]);
        self
    }
    /// Appends a u32 length and `b`.
    pub fn blob(&mut self, b: &[u8]) -> &mut Self {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
        self
    }
}

/// Reads a payload; every read is bounds-checked.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    /// Reads `b`.
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader(b)
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.0.len() < n {
            return Err(ProtoError::Malformed("payload too short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// A byte.
    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    /// A u16.
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    /// A u32.
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A u64.
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    /// UTF-8 text of at most `max` bytes.
    pub fn text(&mut self, max: usize) -> Result<&'a str, ProtoError> {
        let n = self.u16()? as usize;
        if n > max {
            return Err(ProtoError::Malformed("text too long"));
        }
        std::str::from_utf8(self.take(n)?).map_err(|_| ProtoError::Malformed("text is not UTF-8"))
    }
    /// Bytes of at most `max`.
    pub fn blob(&mut self, max: usize) -> Result<&'a [u8], ProtoError> {
        let n = self.u32()? as usize;
        if n > max {
            return Err(ProtoError::Malformed("blob too long"));
        }
        self.take(n)
    }
    /// Fails if bytes are left over.
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Malformed("trailing bytes"))
        }
    }
}

/// A request from the parent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// [`Kind::Hello`].
    Hello,
    /// [`Kind::Create`] (the staging memfd travels beside it).
    Create(Create<'a>),
    /// [`Kind::Alloc`].
    Alloc {
        /// Bytes.
        size: u64,
        /// Alignment.
        align: u64,
    },
    /// [`Kind::Free`].
    Free {
        /// Allocation start.
        addr: u64,
    },
    /// [`Kind::Suspend`].
    Suspend,
    /// [`Kind::Resume`].
    Resume,
    /// [`Kind::SetMemory`].
    SetMemory {
        /// The new quota, bytes.
        memory: u64,
    },
    /// [`Kind::Upload`]: `len` bytes to `dst`; the staging area already
    /// holds source bytes `[0, prefilled)`.
    Upload {
        /// Device address.
        dst: u64,
        /// Bytes.
        len: u64,
        /// Source bytes already staged.
        prefilled: u64,
    },
    /// [`Kind::Download`].
    Download {
        /// Device address.
        src: u64,
        /// Bytes.
        len: u64,
    },
    /// [`Kind::Copy`].
    Copy {
        /// Destination.
        dst: u64,
        /// Source.
        src: u64,
        /// Bytes.
        size: u64,
    },
    /// [`Kind::Fill`].
    Fill {
        /// Start.
        addr: u64,
        /// Bytes.
        size: u64,
        /// 32-bit pattern.
        pattern: u32,
    },
    /// [`Kind::ModuleLoad`].
    ModuleLoad {
        /// `MODULE_FORMAT_*`.
        format: u32,
        /// Image.
        image: &'a [u8],
    },
    /// [`Kind::ModuleUnload`].
    ModuleUnload {
        /// Handle.
        module: u64,
    },
    /// [`Kind::Launch`].
    Launch(Launch<'a>),
    /// [`Kind::Occupancy`]: a launch shape (no parameters).
    Occupancy(Launch<'a>),
    /// [`Kind::Console`].
    Console {
        /// Module handle.
        module: u64,
        /// Most bytes wanted, at most [`MAX_CONSOLE`].
        max: u32,
    },
    /// [`Kind::Queued`]: at most [`MAX_QUEUED_STEPS`].
    Queued(Vec<Step<'a>>),
    /// [`Kind::Start`]: as [`Request::Queued`], on a lane of the partition
    /// (runs of one lane run and finish in order; of different lanes, side
    /// by side).
    Start {
        /// Below [`MAX_LANES`].
        lane: u32,
        /// The run.
        steps: Vec<Step<'a>>,
    },
    /// [`Kind::Finish`]: the next started run to finish, waiting
    /// `within_us` µs at most (0: as long as it takes).
    Finish {
        /// The bound.
        within_us: u32,
    },
    /// [`Kind::FunctionInfo`].
    FunctionInfo {
        /// Module handle.
        module: u64,
        /// Entry point.
        entry: &'a str,
    },
    /// [`Kind::GlobalInfo`].
    GlobalInfo {
        /// Module handle.
        module: u64,
        /// The global's name.
        name: &'a str,
    },
    /// [`Kind::Vmm`].
    Vmm(VmmOp),
    /// [`Kind::Resource`]: the command's bytes
    /// (`vgpu_backend::arrays::Resource::bytes`).
    Resource(Vec<u8>),
    /// [`Kind::Reset`].
    Reset,
    /// [`Kind::Map`] (the file travels beside it).
    Map(Map),
    /// [`Kind::Unmap`].
    Unmap {
        /// The mapping's id.
        id: u64,
    },
    /// [`Kind::Control`] (the socket travels beside it).
    Control,
    /// [`Kind::UploadMapped`]: the pieces, in order, to `dst`.
    UploadMapped {
        /// Device address.
        dst: u64,
        /// Guest memory.
        pieces: Vec<MappedPiece>,
    },
    /// [`Kind::DownloadMapped`]: from `src` into the pieces, in order.
    DownloadMapped {
        /// Device address.
        src: u64,
        /// Guest memory.
        pieces: Vec<MappedPiece>,
    },
}

/// The partition a [`Request::Create`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Create<'a> {
    /// Partition name.
    pub name: &'a str,
    /// Memory quota.
    pub memory: u64,
    /// Compute units.
    pub compute_units: u32,
    /// Bytes of the staging area.
    pub staging_len: u64,
    /// Whether frames after this one go through the mailbox.
    pub mailbox: bool,
}

/// A mapping of guest memory a [`Request::Map`] forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Map {
    /// The mapping's id.
    pub id: u64,
    /// Offset of its first byte in the file.
    pub file_offset: u64,
    /// Bytes.
    pub len: u64,
    /// The device may read it.
    pub readable: bool,
    /// The device may write it.
    pub writable: bool,
}

/// Part of a transfer in a forwarded mapping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MappedPiece {
    /// The mapping ([`Request::Map`]'s id).
    pub mapping: u64,
    /// Offset in the mapping.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// A virtual memory request: its kind, then four 64-bit fields and a
/// 32-bit one (those the kind does not use are 0).
fn encode_vmm(w: &mut Writer, op: &VmmOp) {
    let (kind, [a, b, c, d], e) = match *op {
        VmmOp::Reserve { size, align, addr } => (0u8, [size, align, addr, 0], 0),
        VmmOp::Free { addr, size } => (1, [addr, size, 0, 0], 0),
        VmmOp::Create { size } => (2, [size, 0, 0, 0], 0),
        VmmOp::Release { handle } => (3, [handle, 0, 0, 0], 0),
        VmmOp::Map {
            addr,
            size,
            handle,
            offset,
        } => (4, [addr, size, handle, offset], 0),
        VmmOp::Unmap { addr, size } => (5, [addr, size, 0, 0], 0),
        VmmOp::Access { addr, size, access } => (6, [addr, size, 0, 0], access),
    };
    w.u8(kind).u64(a).u64(b).u64(c).u64(d).u32(e);
}

fn decode_vmm(r: &mut Reader<'_>) -> Result<VmmOp, ProtoError> {
    let kind = r.u8()?;
    let [a, b, c, d] = [r.u64()?, r.u64()?, r.u64()?, r.u64()?];
    let e = r.u32()?;
    let unused = match kind {
        0 => d | u64::from(e),
        1 | 5 => c | d | u64::from(e),
        2 | 3 => b | c | d | u64::from(e),
        4 => u64::from(e),
        6 => c | d,
        _ => return Err(ProtoError::Malformed("virtual memory request")),
    };
    if unused != 0 {
        return Err(ProtoError::Malformed("virtual memory request"));
    }
    Ok(match kind {
        0 => VmmOp::Reserve {
            size: a,
            align: b,
            addr: c,
        },
        1 => VmmOp::Free { addr: a, size: b },
        2 => VmmOp::Create { size: a },
        3 => VmmOp::Release { handle: a },
        4 => VmmOp::Map {
            addr: a,
            size: b,
            handle: c,
            offset: d,
        },
        5 => VmmOp::Unmap { addr: a, size: b },
        _ => VmmOp::Access {
            addr: a,
            size: b,
            access: e,
        },
    })
}

fn encode_pieces(w: &mut Writer, pieces: &[MappedPiece]) {
    w.u32(pieces.len() as u32);
    for p in pieces {
        w.u64(p.mapping).u64(p.offset).u64(p.len);
    }
}

fn decode_pieces(r: &mut Reader<'_>) -> Result<Vec<MappedPiece>, ProtoError> {
    let n = r.u32()? as usize;
    if n == 0 || n > MAX_PIECES {
        return Err(ProtoError::Malformed("piece count"));
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(MappedPiece {
            mapping: r.u64()?,
            offset: r.u64()?,
            len: r.u64()?,
        });
    }
    Ok(v)
}

const STEP_TIMESTAMP: u8 = 0;
const STEP_LAUNCH: u8 = 1;
const STEP_UPLOAD: u8 = 2;
const STEP_DOWNLOAD: u8 = 3;
const STEP_FILL: u8 = 4;
const STEP_COPY: u8 = 5;

/// One step of a [`Request::Queued`] run: `Partition::run_queued`'s steps,
/// launch parameters inline, with guest memory named as pieces of
/// forwarded mappings (the host maps them itself).
pub type Step<'a> = vgpu_backend::Step<Launch<'a>, Vec<MappedPiece>>;

fn encode_launch(w: &mut Writer, l: &Launch<'_>) {
    w.u64(l.module);
    for v in l.grid.iter().chain(&l.block) {
        w.u32(*v);
    }
    w.u32(l.shared_mem);
    for v in &l.cluster {
        w.u32(*v);
    }
    w.u8(l.cooperative as u8);
    w.text(l.entry, MAX_ENTRY).blob(l.params);
}

/// A byte that must be 0 (false) or 1 (true).
fn flag(b: u8) -> Result<bool, ProtoError> {
    match b {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ProtoError::Malformed("bad flag")),
    }
}

fn decode_launch<'a>(r: &mut Reader<'a>) -> Result<Launch<'a>, ProtoError> {
    let module = r.u64()?;
    let mut dims = [0u32; 6];
    for d in &mut dims {
        *d = r.u32()?;
    }
    let shared_mem = r.u32()?;
    let cluster = [r.u32()?, r.u32()?, r.u32()?];
    let cooperative = flag(r.u8()?)?;
    let entry = r.text(MAX_ENTRY)?;
    let params = r.blob(abi::MAX_PARAMS_SIZE as usize)?;
    Ok(Launch {
        cluster,
        cooperative,
        module,
        entry,
        grid: [dims[0], dims[1], dims[2]],
        block: [dims[3], dims[4], dims[5]],
        shared_mem,
        params,
    })
}

impl Request<'_> {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self {
            Request::Hello => Kind::Hello,
            Request::Create(_) => Kind::Create,
            Request::Alloc { .. } => Kind::Alloc,
            Request::Free { .. } => Kind::Free,
            Request::SetMemory { .. } => Kind::SetMemory,
            Request::Suspend => Kind::Suspend,
            Request::Resume => Kind::Resume,
            Request::Upload { .. } => Kind::Upload,
            Request::Download { .. } => Kind::Download,
            Request::Copy { .. } => Kind::Copy,
            Request::Fill { .. } => Kind::Fill,
            Request::ModuleLoad { .. } => Kind::ModuleLoad,
            Request::ModuleUnload { .. } => Kind::ModuleUnload,
            Request::Launch(_) => Kind::Launch,
            Request::Occupancy(_) => Kind::Occupancy,
            Request::Console { .. } => Kind::Console,
            Request::Queued(_) => Kind::Queued,
            Request::Start { .. } => Kind::Start,
            Request::Finish { .. } => Kind::Finish,
            Request::FunctionInfo { .. } => Kind::FunctionInfo,
            Request::GlobalInfo { .. } => Kind::GlobalInfo,
            Request::Vmm(_) => Kind::Vmm,
            Request::Resource(_) => Kind::Resource,
            Request::Reset => Kind::Reset,
            Request::Map(_) => Kind::Map,
            Request::Unmap { .. } => Kind::Unmap,
            Request::Control => Kind::Control,
            Request::UploadMapped { .. } => Kind::UploadMapped,
            Request::DownloadMapped { .. } => Kind::DownloadMapped,
        }
    }

    /// Its payload. Callers keep images and parameters within the ABI's
    /// bounds, which the decoder enforces.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        match self {
            Request::Hello
            | Request::Reset
            | Request::Control
            | Request::Suspend
            | Request::Resume => {}
            Request::Finish { within_us } => {
                w.u32(*within_us);
            }
            Request::Map(m) => {
                w.u64(m.id)
                    .u64(m.file_offset)
                    .u64(m.len)
                    .u8(m.readable as u8 | (m.writable as u8) << 1);
            }
            Request::Unmap { id } => {
                w.u64(*id);
            }
            Request::Vmm(op) => encode_vmm(&mut w, op),
            Request::UploadMapped { dst: a, pieces }
            | Request::DownloadMapped { src: a, pieces } => {
                w.u64(*a);
                encode_pieces(&mut w, pieces);
            }
            Request::Create(c) => {
                w.u64(c.memory)
                    .u32(c.compute_units)
                    .u64(c.staging_len)
                    .u8(c.mailbox as u8)
                    .text(c.name, MAX_NAME);
            }
            Request::Alloc { size, align } => {
                w.u64(*size).u64(*align);
            }
            Request::Free { addr } => {
                w.u64(*addr);
            }
            Request::SetMemory { memory } => {
                w.u64(*memory);
            }
            Request::Upload {
                dst,
                len,
                prefilled,
            } => {
                w.u64(*dst).u64(*len).u64(*prefilled);
            }
            Request::Download { src, len } => {
                w.u64(*src).u64(*len);
            }
            Request::Copy { dst, src, size } => {
                w.u64(*dst).u64(*src).u64(*size);
            }
            Request::Fill {
                addr,
                size,
                pattern,
            } => {
                w.u64(*addr).u64(*size).u32(*pattern);
            }
            Request::ModuleLoad { format, image } => {
                w.u32(*format).blob(image);
            }
            Request::ModuleUnload { module } => {
                w.u64(*module);
            }
            Request::FunctionInfo {
                module,
                entry: name,
            }
            | Request::GlobalInfo { module, name } => {
                w.u64(*module).text(name, MAX_ENTRY);
            }
            Request::Launch(l) | Request::Occupancy(l) => encode_launch(&mut w, l),
            Request::Resource(r) => {
                w.blob(r);
            }
            Request::Console { module, max } => {
                w.u64(*module).u32(*max);
            }
            Request::Queued(steps) | Request::Start { steps, .. } => {
                if let Request::Start { lane, .. } = self {
                    w.u32(*lane);
                }
                w.u32(steps.len() as u32);
                for s in steps {
                    match s {
                        Step::Timestamp => {
                            w.u8(STEP_TIMESTAMP);
                        }
                        Step::Launch(l) => {
                            w.u8(STEP_LAUNCH);
                            encode_launch(&mut w, l);
                        }
                        Step::Upload {
                            dst: a,
                            src: pieces,
                        }
                        | Step::Download {
                            src: a,
                            dst: pieces,
                        } => {
                            let kind = if matches!(s, Step::Upload { .. }) {
                                STEP_UPLOAD
                            } else {
                                STEP_DOWNLOAD
                            };
                            w.u8(kind).u64(*a);
                            encode_pieces(&mut w, pieces);
                        }
                        Step::Fill(f) => {
                            w.u8(STEP_FILL).u64(f.addr).u64(f.size).u32(f.pattern);
                        }
                        Step::Copy(c) => {
                            w.u8(STEP_COPY).u64(c.dst).u64(c.src).u64(c.size);
                        }
                    }
                }
            }
        }
        w.0
    }

    /// Decodes a request of `kind`.
    pub fn decode(kind: u16, payload: &[u8]) -> Result<Request<'_>, ProtoError> {
        let k = Kind::from_raw(kind).ok_or(ProtoError::Kind(kind))?;
        let mut r = Reader::new(payload);
        let req = match k {
            Kind::Hello => Request::Hello,
            Kind::Reset => Request::Reset,
            Kind::Control => Request::Control,
            Kind::Finish => Request::Finish {
                within_us: r.u32()?,
            },
            Kind::Map => {
                let id = r.u64()?;
                let file_offset = r.u64()?;
                let len = r.u64()?;
                let prot = r.u8()?;
                if prot > 3 {
                    return Err(ProtoError::Malformed("bad flag"));
                }
                Request::Map(Map {
                    id,
                    file_offset,
                    len,
                    readable: prot & 1 != 0,
                    writable: prot & 2 != 0,
                })
            }
            Kind::Unmap => Request::Unmap { id: r.u64()? },
            Kind::Vmm => Request::Vmm(decode_vmm(&mut r)?),
            Kind::UploadMapped => Request::UploadMapped {
                dst: r.u64()?,
                pieces: decode_pieces(&mut r)?,
            },
            Kind::DownloadMapped => Request::DownloadMapped {
                src: r.u64()?,
                pieces: decode_pieces(&mut r)?,
            },
            Kind::Create => {
                let memory = r.u64()?;
                let compute_units = r.u32()?;
                let staging_len = r.u64()?;
                let mailbox = match r.u8()? {
                    0 => false,
                    1 => true,
                    _ => return Err(ProtoError::Malformed("bad flag")),
                };
                Request::Create(Create {
                    memory,
                    compute_units,
                    staging_len,
                    mailbox,
                    name: r.text(MAX_NAME)?,
                })
            }
            Kind::Alloc => Request::Alloc {
                size: r.u64()?,
                align: r.u64()?,
            },
            Kind::Free => Request::Free { addr: r.u64()? },
            Kind::SetMemory => Request::SetMemory { memory: r.u64()? },
            Kind::Suspend => Request::Suspend,
            Kind::Resume => Request::Resume,
            Kind::Upload => Request::Upload {
                dst: r.u64()?,
                len: r.u64()?,
                prefilled: r.u64()?,
            },
            Kind::Download => Request::Download {
                src: r.u64()?,
                len: r.u64()?,
            },
            Kind::Copy => Request::Copy {
                dst: r.u64()?,
                src: r.u64()?,
                size: r.u64()?,
            },
            Kind::Fill => Request::Fill {
                addr: r.u64()?,
                size: r.u64()?,
                pattern: r.u32()?,
            },
            Kind::ModuleLoad => Request::ModuleLoad {
                format: r.u32()?,
                image: r.blob(abi::MAX_MODULE_SIZE as usize)?,
            },
            Kind::ModuleUnload => Request::ModuleUnload { module: r.u64()? },
            Kind::FunctionInfo => Request::FunctionInfo {
                module: r.u64()?,
                entry: r.text(MAX_ENTRY)?,
            },
            Kind::GlobalInfo => Request::GlobalInfo {
                module: r.u64()?,
                name: r.text(MAX_ENTRY)?,
            },
            Kind::Launch => Request::Launch(decode_launch(&mut r)?),
            Kind::Resource => {
                let bytes = r.blob(MAX_RESOURCE)?;
                vgpu_backend::arrays::Resource::from_bytes(bytes)
                    .map_err(|_| ProtoError::Malformed("bad resource request"))?;
                Request::Resource(bytes.to_vec())
            }
            Kind::Occupancy => Request::Occupancy(decode_launch(&mut r)?),
            Kind::Console => {
                let module = r.u64()?;
                let max = r.u32()?;
                if max == 0 || max as usize > MAX_CONSOLE {
                    return Err(ProtoError::Malformed("console size"));
                }
                Request::Console { module, max }
            }
            Kind::Queued | Kind::Start => {
                let lane = if k == Kind::Start { r.u32()? } else { 0 };
                if lane >= MAX_LANES {
                    return Err(ProtoError::Malformed("lane"));
                }
                let n = r.u32()? as usize;
                if n == 0 || n > MAX_QUEUED_STEPS {
                    return Err(ProtoError::Malformed("step count"));
                }
                let mut steps = Vec::with_capacity(n);
                for _ in 0..n {
                    steps.push(match r.u8()? {
                        STEP_TIMESTAMP => Step::Timestamp,
                        STEP_LAUNCH => Step::Launch(decode_launch(&mut r)?),
                        STEP_UPLOAD => Step::Upload {
                            dst: r.u64()?,
                            src: decode_pieces(&mut r)?,
                        },
                        STEP_DOWNLOAD => Step::Download {
                            src: r.u64()?,
                            dst: decode_pieces(&mut r)?,
                        },
                        STEP_FILL => Step::Fill(DeviceFill {
                            addr: r.u64()?,
                            size: r.u64()?,
                            pattern: r.u32()?,
                        }),
                        STEP_COPY => Step::Copy(DeviceCopy {
                            dst: r.u64()?,
                            src: r.u64()?,
                            size: r.u64()?,
                        }),
                        _ => return Err(ProtoError::Malformed("step kind")),
                    });
                }
                if k == Kind::Start {
                    Request::Start { lane, steps }
                } else {
                    Request::Queued(steps)
                }
            }
            Kind::Need | Kind::Out => return Err(ProtoError::Kind(kind)),
        };
        r.finish()?;
        Ok(req)
    }
}

/// What a successful request returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// Nothing.
    None,
    /// An address or module handle.
    U64(u64),
    /// [`Kind::Create`]: what the partition offers.
    Created {
        /// `Partition::kernel_compute_units` (at least 1).
        units: u32,
        /// `Partition::cooperative`.
        cooperative: bool,
        /// `Partition::has_vmm` (protocol 7).
        vmm: bool,
        /// `Partition::arrays`.
        arrays: bool,
    },
    /// [`Kind::Hello`]: the host's backend.
    Hello {
        /// Backend name.
        name: String,
        /// Its capacity.
        capacity: Capacity,
    },
    /// [`Kind::FunctionInfo`].
    Function(FunctionInfo),
    /// [`Kind::GlobalInfo`]: address and size.
    Global(u64, u64),
    /// [`Kind::Reset`]: whether the host cannot recover in place and must
    /// be replaced by a fresh process.
    Reset {
        /// Replace the host.
        respawn: bool,
    },
    /// [`Kind::Queued`]: one result per step.
    Queued(Vec<QueuedDone>),
    /// [`Kind::Finish`]: the next started run to finish, of any lane
    /// (the oldest not yet given of that lane). (A finish whose bound
    /// passed with none finished is answered [`Value::None`].)
    Finished(LaneRun),
    /// [`Kind::Start`]: results of the started runs done by the time the
    /// run was taken, in the order they finished (at most
    /// [`MAX_STARTED`]).
    Started(Vec<LaneRun>),
    /// [`Kind::Console`].
    Console(ConsoleText),
    /// [`Kind::Download`]: the last piece left in the staging area.
    Download {
        /// Offset in the transfer.
        offset: u64,
        /// Bytes (0: none).
        len: u64,
        /// Where it starts in the staging area.
        at: u64,
    },
}

/// A decoded reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The partition's memory in use after the request.
    pub memory_used: u64,
    /// Result.
    pub result: Result<Value, OpError>,
}

const ERR_INVALID: u8 = 1;
const ERR_NO_MEMORY: u8 = 2;
const ERR_UNSUPPORTED: u8 = 3;
const ERR_NOT_FOUND: u8 = 4;
const ERR_OUT_OF_RANGE: u8 = 5;
const ERR_FAULT: u8 = 6;
const ERR_DEVICE: u8 = 7;
const ERR_LOST: u8 = 8;
const ERR_KERNEL_FAULT: u8 = 9;
const ERR_KERNEL_ASSERT: u8 = 10;
const ERR_CONTEXT_LOST: u8 = 11;

fn error_status(e: &OpError) -> u8 {
    match e {
        OpError::Invalid(_) => ERR_INVALID,
        OpError::NoMemory { .. } => ERR_NO_MEMORY,
        OpError::Unsupported(_) => ERR_UNSUPPORTED,
        OpError::NotFound(_) => ERR_NOT_FOUND,
        OpError::OutOfRange { .. } => ERR_OUT_OF_RANGE,
        OpError::Fault(_) => ERR_FAULT,
        OpError::Device(_) => ERR_DEVICE,
        OpError::Lost(_) => ERR_LOST,
        OpError::KernelFault(_) => ERR_KERNEL_FAULT,
        OpError::KernelAssert(_) => ERR_KERNEL_ASSERT,
        OpError::ContextLost(_) => ERR_CONTEXT_LOST,
    }
}

/// The fields of `e` after its status byte.
fn encode_error(w: &mut Writer, e: &OpError) {
    match e {
        OpError::Invalid(s)
        | OpError::Unsupported(s)
        | OpError::NotFound(s)
        | OpError::Device(s)
        | OpError::Lost(s)
        | OpError::KernelFault(s)
        | OpError::KernelAssert(s)
        | OpError::ContextLost(s) => {
            w.text(s, MAX_TEXT);
        }
        OpError::NoMemory {
            requested,
            available,
        } => {
            w.u64(*requested).u64(*available);
        }
        OpError::OutOfRange { addr, len } => {
            w.u64(*addr).u64(*len);
        }
        OpError::Fault(off) => {
            w.u64(*off);
        }
    }
}

/// The results of a queued run, one per step.
fn encode_done(w: &mut Writer, done: &[QueuedDone]) {
    w.u32(done.len() as u32);
    for d in done {
        w.u8(d.result.as_ref().err().map_or(0, error_status))
            .u64(d.end_ns);
        if let Err(e) = &d.result {
            encode_error(w, e);
        }
    }
}

/// A finished run and the lane it was started on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaneRun {
    /// The lane.
    pub lane: u32,
    /// Its results.
    pub run: Finished,
}

fn encode_finished(w: &mut Writer, f: &LaneRun) {
    w.u32(f.lane).u64(f.run.waited_ns);
    encode_done(w, &f.run.done);
}

fn decode_finished(r: &mut Reader<'_>) -> Result<LaneRun, ProtoError> {
    let lane = r.u32()?;
    if lane >= MAX_LANES {
        return Err(ProtoError::Malformed("lane"));
    }
    Ok(LaneRun {
        lane,
        run: Finished {
            waited_ns: r.u64()?,
            done: decode_done(r)?,
        },
    })
}

fn decode_done(r: &mut Reader<'_>) -> Result<Vec<QueuedDone>, ProtoError> {
    let n = r.u32()? as usize;
    if n > MAX_QUEUED_STEPS {
        return Err(ProtoError::Malformed("step count"));
    }
    let mut done = Vec::with_capacity(n);
    for _ in 0..n {
        let status = r.u8()?;
        let end_ns = r.u64()?;
        let result = match status {
            0 => Ok(()),
            s => Err(decode_error(s, r)?),
        };
        done.push(QueuedDone { result, end_ns });
    }
    Ok(done)
}

/// The error of (non-zero) `status`, its fields read from `r`.
fn decode_error(status: u8, r: &mut Reader<'_>) -> Result<OpError, ProtoError> {
    let text = |r: &mut Reader<'_>| r.text(MAX_TEXT).map(str::to_string);
    Ok(match status {
        ERR_INVALID => OpError::Invalid(text(r)?),
        ERR_UNSUPPORTED => OpError::Unsupported(text(r)?),
        ERR_NOT_FOUND => OpError::NotFound(text(r)?),
        ERR_DEVICE => OpError::Device(text(r)?),
        ERR_LOST => OpError::Lost(text(r)?),
        ERR_KERNEL_FAULT => OpError::KernelFault(text(r)?),
        ERR_KERNEL_ASSERT => OpError::KernelAssert(text(r)?),
        ERR_CONTEXT_LOST => OpError::ContextLost(text(r)?),
        ERR_NO_MEMORY => OpError::NoMemory {
            requested: r.u64()?,
            available: r.u64()?,
        },
        ERR_OUT_OF_RANGE => OpError::OutOfRange {
            addr: r.u64()?,
            len: r.u64()?,
        },
        ERR_FAULT => OpError::Fault(r.u64()?),
        _ => return Err(ProtoError::Malformed("unknown status")),
    })
}

impl Reply {
    /// The payload of this reply to a request of `kind`.
    pub fn encode(&self, kind: Kind) -> Vec<u8> {
        let mut w = Writer::default();
        let status = self.result.as_ref().err().map_or(0, error_status);
        w.u8(status).u64(self.memory_used);
        match &self.result {
            Ok(v) => match (kind, v) {
                (Kind::Hello, Value::Hello { name, capacity }) => {
                    w.u64(capacity.memory)
                        .u32(capacity.compute_units)
                        .text(name, MAX_NAME);
                }
                (
                    Kind::Alloc
                    | Kind::ModuleLoad
                    | Kind::Occupancy
                    | Kind::Vmm
                    | Kind::Resource
                    | Kind::Suspend
                    | Kind::Resume,
                    Value::U64(x),
                ) => {
                    w.u64(*x);
                }
                (
                    Kind::Create,
                    Value::Created {
                        units,
                        cooperative,
                        vmm,
                        arrays,
                    },
                ) => {
                    w.u32(*units)
                        .u8(*cooperative as u8)
                        .u8(*vmm as u8)
                        .u8(*arrays as u8);
                }
                (Kind::Reset, Value::Reset { respawn }) => {
                    w.u8(*respawn as u8);
                }
                (Kind::GlobalInfo, Value::Global(addr, size)) => {
                    w.u64(*addr).u64(*size);
                }
                (Kind::FunctionInfo, Value::Function(f)) => {
                    // The count is implied by the parameter entries.
                    let a = &f.attrs;
                    for v in [
                        a.max_threads,
                        a.shared_static,
                        a.max_dynamic_shared,
                        a.const_bytes,
                        a.local_bytes,
                        a.num_regs,
                        a.ptx_version,
                        a.binary_version,
                    ] {
                        w.u32(v);
                    }
                    w.u32(f.params.len() as u32);
                    for p in &f.params {
                        w.u32(p.offset).u32(p.size);
                    }
                }
                (Kind::Download, Value::Download { offset, len, at }) => {
                    w.u64(*offset).u64(*len).u64(*at);
                }
                (Kind::Console, Value::Console(c)) => {
                    w.u64(c.dropped).blob(&c.text);
                }
                (Kind::Queued, Value::Queued(done)) => encode_done(&mut w, done),
                (Kind::Finish, Value::Finished(f)) => {
                    w.u8(1);
                    encode_finished(&mut w, f);
                }
                (Kind::Finish, _) => {
                    w.u8(0);
                }
                (Kind::Start, Value::Started(done)) => {
                    w.u32(done.len() as u32);
                    for f in done {
                        encode_finished(&mut w, f);
                    }
                }
                _ => {}
            },
            Err(e) => encode_error(&mut w, e),
        }
        w.0
    }

    /// Decodes a reply to a request of `kind` (syntax only; the caller
    /// checks the values against what it asked).
    pub fn decode(kind: Kind, payload: &[u8]) -> Result<Reply, ProtoError> {
        let mut r = Reader::new(payload);
        let status = r.u8()?;
        let memory_used = r.u64()?;
        let result = match status {
            0 => Ok(match kind {
                Kind::Hello => {
                    let memory = r.u64()?;
                    let compute_units = r.u32()?;
                    Value::Hello {
                        name: r.text(MAX_NAME)?.to_string(),
                        capacity: Capacity {
                            memory,
                            compute_units,
                        },
                    }
                }
                Kind::Alloc
                | Kind::ModuleLoad
                | Kind::Occupancy
                | Kind::Vmm
                | Kind::Resource
                | Kind::Suspend
                | Kind::Resume => Value::U64(r.u64()?),
                Kind::Create => Value::Created {
                    units: r.u32()?,
                    cooperative: flag(r.u8()?)?,
                    vmm: flag(r.u8()?)?,
                    arrays: flag(r.u8()?)?,
                },
                Kind::Reset => Value::Reset {
                    respawn: match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return Err(ProtoError::Malformed("bad flag")),
                    },
                },
                Kind::Download => Value::Download {
                    offset: r.u64()?,
                    len: r.u64()?,
                    at: r.u64()?,
                },
                Kind::GlobalInfo => Value::Global(r.u64()?, r.u64()?),
                Kind::Console => {
                    let dropped = r.u64()?;
                    Value::Console(ConsoleText {
                        dropped,
                        text: r.blob(MAX_CONSOLE)?.to_vec(),
                    })
                }
                Kind::Queued => Value::Queued(decode_done(&mut r)?),
                Kind::Finish => match r.u8()? {
                    0 => Value::None,
                    1 => Value::Finished(decode_finished(&mut r)?),
                    _ => return Err(ProtoError::Malformed("bad flag")),
                },
                Kind::Start => {
                    let n = r.u32()? as usize;
                    if n > MAX_STARTED {
                        return Err(ProtoError::Malformed("too many finished runs"));
                    }
                    let mut done = Vec::with_capacity(n);
                    for _ in 0..n {
                        done.push(decode_finished(&mut r)?);
                    }
                    Value::Started(done)
                }
                Kind::FunctionInfo => {
                    let mut v = [0u32; 8];
                    for x in &mut v {
                        *x = r.u32()?;
                    }
                    let attrs = abi::FuncInfo {
                        max_threads: v[0],
                        shared_static: v[1],
                        max_dynamic_shared: v[2],
                        const_bytes: v[3],
                        local_bytes: v[4],
                        num_regs: v[5],
                        ptx_version: v[6],
                        binary_version: v[7],
                        ..Default::default()
                    };
                    let n = r.u32()?;
                    if n > abi::MAX_FUNC_PARAMS {
                        return Err(ProtoError::Malformed("too many parameters"));
                    }
                    let mut params = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        params.push((r.u32()?, r.u32()?));
                    }
                    Value::Function(FunctionInfo::new(params, attrs))
                }
                Kind::Need | Kind::Out => return Err(ProtoError::Kind(kind as u16)),
                _ => Value::None,
            }),
            s => Err(decode_error(s, &mut r)?),
        };
        r.finish()?;
        Ok(Reply {
            memory_used,
            result,
        })
    }
}

/// A callback's piece ([`Kind::Need`], [`Kind::Out`]): `len` bytes at
/// `offset` of the transfer, at byte `at` of the staging area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// Offset in the transfer.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Offset in the staging area.
    pub at: u64,
}

impl Piece {
    /// Its payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.u64(self.offset).u64(self.len).u64(self.at);
        w.0
    }

    /// Decodes a piece.
    pub fn decode(payload: &[u8]) -> Result<Piece, ProtoError> {
        let mut r = Reader::new(payload);
        let p = Piece {
            offset: r.u64()?,
            len: r.u64()?,
            at: r.u64()?,
        };
        r.finish()?;
        Ok(p)
    }

    /// Where it ends in the transfer.
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.len)
    }
}

/// The parent's answer to a callback: done, or a fault of the guest
/// memory at an offset of the transfer.
pub fn encode_answer(fault: Option<u64>) -> Vec<u8> {
    let mut w = Writer::default();
    match fault {
        None => w.u8(0),
        Some(off) => w.u8(1).u64(off),
    };
    w.0
}

/// Decodes the parent's answer to a callback.
pub fn decode_answer(payload: &[u8]) -> Result<Option<u64>, ProtoError> {
    let mut r = Reader::new(payload);
    let v = match r.u8()? {
        0 => None,
        1 => Some(r.u64()?),
        _ => return Err(ProtoError::Malformed("bad answer")),
    };
    r.finish()?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u16, seq: u32, len: u32) -> [u8; HEADER_LEN] {
        Header { kind, seq, len }.encode()
    }

    #[test]
    fn test_header_roundtrip_and_refusals() {
        let h = Header::decode(&header(REPLY | 3, 7, 9), MAX_REPLY).unwrap();
        assert_eq!((h.kind, h.seq, h.len), (REPLY | 3, 7, 9));
        let mut b = header(3, 1, 0);
        b[0] ^= 1;
        assert!(matches!(
            Header::decode(&b, MAX_REPLY),
            Err(ProtoError::Magic(_))
        ));
        let mut b = header(3, 1, 0);
        b[4] = VERSION as u8 + 1;
        assert_eq!(
            Header::decode(&b, MAX_REPLY),
            Err(ProtoError::Version(VERSION + 1))
        );
        assert_eq!(
            Header::decode(&header(3, 1, MAX_REPLY + 1), MAX_REPLY),
            Err(ProtoError::TooLong {
                len: MAX_REPLY + 1,
                max: MAX_REPLY
            })
        );
        assert!(Header::decode(&header(3, 1, u32::MAX), MAX_REQUEST).is_err());
    }

    #[test]
    fn test_requests_roundtrip() {
        let params = [7u8; 24];
        let image = b"// PTX".to_vec();
        let reqs = [
            Request::Hello,
            Request::Create(Create {
                name: "tenant-a",
                memory: 1 << 30,
                compute_units: 3,
                staging_len: 1 << 20,
                mailbox: true,
            }),
            Request::Alloc {
                size: 4096,
                align: 256,
            },
            Request::Free { addr: 0x1000 },
            Request::SetMemory { memory: 3 << 30 },
            Request::Suspend,
            Request::Resume,
            Request::Upload {
                dst: 1,
                len: 2,
                prefilled: 2,
            },
            Request::Download { src: 5, len: 6 },
            Request::Copy {
                dst: 1,
                src: 2,
                size: 3,
            },
            Request::Fill {
                addr: 1,
                size: 8,
                pattern: 0xdead_beef,
            },
            Request::ModuleLoad {
                format: abi::MODULE_FORMAT_PTX,
                image: &image,
            },
            Request::ModuleUnload { module: 9 },
            Request::Console {
                module: 9,
                max: MAX_CONSOLE as u32,
            },
            Request::FunctionInfo {
                module: 9,
                entry: "_ZN8cublasLt19splitKreduce_kernelILi32ELi16EiffffLb1ELb0EEEvNS_18cublasSplitKParamsIT4_EE",
            },
            Request::GlobalInfo {
                module: 9,
                name: "_ZN6cublas8internal10gemvTablesE",
            },
            Request::Resource(
                vgpu_backend::arrays::Resource::ArrayCreate(abi::ArrayCmd {
                    hdr: abi::CmdHeader {
                        opcode: abi::OP_ARRAY_CREATE,
                        flags: abi::ARRAY_FLAG_LAYERED,
                    },
                    format: abi::FORMAT_U8,
                    channels: 4,
                    width: 64,
                    height: 32,
                    depth: 3,
                })
                .bytes(),
            ),
            Request::Launch(Launch {
                module: abi::MODULE_BUILTIN,
                entry: "saxpy_f32",
                grid: [1, 2, 3],
                block: [4, 5, 6],
                shared_mem: 128,
                cluster: [2, 1, 1],
                cooperative: true,
                params: &params,
            }),
            Request::Queued(vec![
                Step::Timestamp,
                Step::Launch(Launch {
                    module: 3,
                    entry: "vector_add",
                    grid: [9, 1, 1],
                    block: [256, 1, 1],
                    shared_mem: 0,
                    cluster: [1, 1, 1],
                    cooperative: false,
                    params: &params,
                }),
                Step::Timestamp,
                Step::Upload {
                    dst: 7,
                    src: vec![MappedPiece {
                        mapping: 3,
                        offset: 4,
                        len: 5,
                    }],
                },
                Step::Download {
                    src: 9,
                    dst: vec![
                        MappedPiece {
                            mapping: 3,
                            offset: 4,
                            len: 5,
                        },
                        MappedPiece {
                            mapping: 4,
                            offset: 0,
                            len: 6,
                        },
                    ],
                },
                Step::Fill(DeviceFill {
                    addr: 0x100,
                    size: 64,
                    pattern: 0x0101_0101,
                }),
                Step::Copy(DeviceCopy {
                    dst: 0x200,
                    src: 0x300,
                    size: 12,
                }),
            ]),
            Request::Start {
                lane: 3,
                steps: vec![
                Step::Timestamp,
                Step::Upload {
                    dst: 7,
                    src: vec![MappedPiece {
                        mapping: 3,
                        offset: 4,
                        len: 5,
                    }],
                },
            ]},
            Request::Finish { within_us: 0 },
            Request::Finish { within_us: 200 },
            Request::Vmm(VmmOp::Reserve {
                size: 1 << 30,
                align: 0,
                addr: 0x7f00_0000_0000,
            }),
            Request::Vmm(VmmOp::Free { addr: 1, size: 2 }),
            Request::Vmm(VmmOp::Create { size: 2 << 20 }),
            Request::Vmm(VmmOp::Release { handle: 9 }),
            Request::Vmm(VmmOp::Map {
                addr: 1,
                size: 2,
                handle: 3,
                offset: 4,
            }),
            Request::Vmm(VmmOp::Unmap { addr: 1, size: 2 }),
            Request::Vmm(VmmOp::Access {
                addr: 1,
                size: 2,
                access: 3,
            }),
            Request::Reset,
            Request::Control,
            Request::Map(Map {
                id: 3,
                file_offset: 1 << 20,
                len: 1 << 30,
                readable: true,
                writable: false,
            }),
            Request::Unmap { id: 3 },
            Request::UploadMapped {
                dst: 8,
                pieces: vec![MappedPiece {
                    mapping: 3,
                    offset: 4,
                    len: 5,
                }],
            },
            Request::DownloadMapped {
                src: 8,
                pieces: vec![
                    MappedPiece {
                        mapping: 1,
                        offset: 2,
                        len: 3,
                    };
                    MAX_PIECES
                ],
            },
        ];
        for req in &reqs {
            let payload = req.encode();
            assert_eq!(&Request::decode(req.kind() as u16, &payload).unwrap(), req);
            // Every truncation and every extra byte is refused.
            for cut in 0..payload.len() {
                assert!(Request::decode(req.kind() as u16, &payload[..cut]).is_err());
            }
            let mut long = payload.clone();
            long.push(0);
            assert!(Request::decode(req.kind() as u16, &long).is_err());
        }
        assert_eq!(Request::decode(99, &[]), Err(ProtoError::Kind(99)));
        let piece = Piece {
            offset: 0,
            len: 1,
            at: 0,
        };
        assert!(Request::decode(Kind::Need as u16, &piece.encode()).is_err());
    }

    #[test]
    fn test_request_bounds() {
        // A launch whose parameter block claims more than the ABI allows.
        let mut w = Writer::default();
        w.u64(0);
        for _ in 0..10 {
            w.u32(1);
        }
        w.u8(0)
            .text("fill_u32", MAX_ENTRY)
            .u32(abi::MAX_PARAMS_SIZE + 1);
        w.0.extend(std::iter::repeat_n(0, abi::MAX_PARAMS_SIZE as usize + 1));
        assert!(Request::decode(Kind::Launch as u16, &w.0).is_err());
        // The most it allows is carried.
        let mut w = Writer::default();
        w.u64(0);
        for _ in 0..10 {
            w.u32(1);
        }
        w.u8(0)
            .text("fill_u32", MAX_ENTRY)
            .u32(abi::MAX_PARAMS_SIZE);
        w.0.extend(std::iter::repeat_n(7, abi::MAX_PARAMS_SIZE as usize));
        match Request::decode(Kind::Launch as u16, &w.0) {
            Ok(Request::Launch(l)) => assert_eq!(l.params.len(), abi::MAX_PARAMS_SIZE as usize),
            other => panic!("{other:?}"),
        }
        // A resource request that is no command, or too long.
        let mut w = Writer::default();
        w.blob(&[0; 16]);
        assert!(Request::decode(Kind::Resource as u16, &w.0).is_err());
        let mut w = Writer::default();
        w.blob(&[0; MAX_RESOURCE + 1]);
        assert!(Request::decode(Kind::Resource as u16, &w.0).is_err());
        // A name that is not UTF-8.
        let mut w = Writer::default();
        w.u64(1).u32(1).u64(1).u8(0).u16(2);
        w.0.extend_from_slice(&[0xff, 0xfe]);
        assert_eq!(
            Request::decode(Kind::Create as u16, &w.0),
            Err(ProtoError::Malformed("text is not UTF-8"))
        );
        // A virtual memory request of an unknown kind, or with a field
        // its kind does not use.
        for (kind, unused) in [(7u8, 0u64), (2, 1), (4, 0)] {
            let mut w = Writer::default();
            w.u8(kind)
                .u64(1)
                .u64(unused)
                .u64(0)
                .u64(0)
                .u32(u32::from(kind == 4));
            assert_eq!(
                Request::decode(Kind::Vmm as u16, &w.0),
                Err(ProtoError::Malformed("virtual memory request"))
            );
        }
        // No pieces, or more than allowed (refused before reading them).
        for n in [0, MAX_PIECES as u32 + 1, u32::MAX] {
            let mut w = Writer::default();
            w.u64(0).u32(n);
            assert_eq!(
                Request::decode(Kind::UploadMapped as u16, &w.0),
                Err(ProtoError::Malformed("piece count"))
            );
        }
        // A kernel description with more parameters than the ABI allows
        // is refused before they are read.
        let mut w = Writer::default();
        w.u8(0).u64(0);
        for _ in 0..8 {
            w.u32(0);
        }
        w.u32(abi::MAX_FUNC_PARAMS + 1);
        assert_eq!(
            Reply::decode(Kind::FunctionInfo, &w.0),
            Err(ProtoError::Malformed("too many parameters"))
        );
        // Queued runs of no steps, of more than allowed (refused before
        // reading them), or with a step of no known kind.
        for n in [0, MAX_QUEUED_STEPS as u32 + 1, u32::MAX] {
            let mut w = Writer::default();
            w.u32(n);
            assert_eq!(
                Request::decode(Kind::Queued as u16, &w.0),
                Err(ProtoError::Malformed("step count"))
            );
        }
        let mut w = Writer::default();
        w.u32(1).u8(7);
        assert_eq!(
            Request::decode(Kind::Queued as u16, &w.0),
            Err(ProtoError::Malformed("step kind"))
        );
        let mut w = Writer::default();
        w.u8(0).u64(0).u32(MAX_QUEUED_STEPS as u32 + 1);
        assert_eq!(
            Reply::decode(Kind::Queued, &w.0),
            Err(ProtoError::Malformed("step count"))
        );
        // Console requests of nothing or of more than a reply carries,
        // and a reply with more than that.
        for max in [0, MAX_CONSOLE as u32 + 1] {
            let mut w = Writer::default();
            w.u64(1).u32(max);
            assert_eq!(
                Request::decode(Kind::Console as u16, &w.0),
                Err(ProtoError::Malformed("console size"))
            );
        }
        let mut w = Writer::default();
        w.u8(0).u64(0).u64(0).blob(&vec![b'x'; MAX_CONSOLE + 1]);
        assert!(Reply::decode(Kind::Console, &w.0).is_err());
        // A cooperative flag that is neither 0 nor 1.
        let mut w = Writer::default();
        w.u8(0).u64(0).u32(1).u8(2);
        assert!(Reply::decode(Kind::Create, &w.0).is_err());
        let mut w = Writer::default();
        w.u64(1);
        // Grid, block, shared memory and cluster.
        for _ in 0..10 {
            w.u32(1);
        }
        w.u8(2).text("k", MAX_ENTRY).blob(&[]);
        assert!(Request::decode(Kind::Launch as u16, &w.0).is_err());
        w.0[8 + 40] = 1;
        assert!(Request::decode(Kind::Launch as u16, &w.0).is_ok());
        // Protection bits beyond read and write.
        let mut w = Writer::default();
        w.u64(1).u64(0).u64(4096).u8(4);
        assert!(Request::decode(Kind::Map as u16, &w.0).is_err());
    }

    #[test]
    fn test_replies_roundtrip() {
        let cases = [
            (
                Kind::Hello,
                Ok(Value::Hello {
                    name: "software".into(),
                    capacity: Capacity {
                        memory: 1 << 30,
                        compute_units: 4,
                    },
                }),
            ),
            (Kind::Alloc, Ok(Value::U64(0x10_0000))),
            (Kind::Vmm, Ok(Value::U64(0x7f00_0020_0000))),
            (Kind::ModuleLoad, Ok(Value::U64(2))),
            (
                Kind::Create,
                Ok(Value::Created {
                    units: 132,
                    cooperative: true,
                    vmm: true,
                    arrays: true,
                }),
            ),
            (Kind::Resource, Ok(Value::U64(0x7f00_0000_2000))),
            (Kind::Free, Ok(Value::None)),
            (Kind::SetMemory, Ok(Value::None)),
            (Kind::Suspend, Ok(Value::U64(1 << 20))),
            (Kind::Reset, Ok(Value::Reset { respawn: true })),
            (
                Kind::Download,
                Ok(Value::Download {
                    offset: 8,
                    len: 4,
                    at: 16,
                }),
            ),
            (
                Kind::FunctionInfo,
                Ok(Value::Function(FunctionInfo::new(
                    [(0, 8), (8, 4), (16, 96)],
                    abi::FuncInfo {
                        max_threads: 1024,
                        shared_static: 512,
                        max_dynamic_shared: 100_000,
                        const_bytes: 4,
                        local_bytes: 16,
                        num_regs: 40,
                        ptx_version: 80,
                        binary_version: 90,
                        ..Default::default()
                    },
                ))),
            ),
            (Kind::GlobalInfo, Ok(Value::Global(0x7f00_0000_1000, 4096))),
            (
                Kind::Queued,
                Ok(Value::Queued(vec![
                    QueuedDone {
                        result: Ok(()),
                        end_ns: 1_500,
                    },
                    QueuedDone {
                        result: Err(OpError::OutOfRange { addr: 1, len: 2 }),
                        end_ns: 1_500,
                    },
                    QueuedDone {
                        result: Err(OpError::KernelFault("illegal address".into())),
                        end_ns: 9_000,
                    },
                ])),
            ),
            (Kind::Queued, Ok(Value::Queued(Vec::new()))),
            (Kind::Start, Ok(Value::Started(Vec::new()))),
            (
                Kind::Start,
                Ok(Value::Started(vec![
                    LaneRun {
                        lane: 2,
                        run: Finished {
                            waited_ns: 3,
                            done: Vec::new(),
                        },
                    },
                    LaneRun {
                        lane: 0,
                        run: Finished {
                            waited_ns: 0,
                            done: vec![QueuedDone {
                                result: Ok(()),
                                end_ns: 9,
                            }],
                        },
                    },
                ])),
            ),
            (Kind::Finish, Ok(Value::None)),
            (
                Kind::Finish,
                Ok(Value::Finished(LaneRun {
                    lane: 15,
                    run: Finished {
                        waited_ns: 12_345,
                        done: vec![QueuedDone {
                            result: Err(OpError::Lost("gone".into())),
                            end_ns: 7,
                        }],
                    },
                })),
            ),
            (
                Kind::Console,
                Ok(Value::Console(ConsoleText {
                    text: b"thread 3 of 40: 1.500000 ok\n".to_vec(),
                    dropped: 12,
                })),
            ),
            (Kind::Console, Ok(Value::Console(ConsoleText::default()))),
            (Kind::Alloc, Err(OpError::Invalid("bad".into()))),
            (
                Kind::Alloc,
                Err(OpError::NoMemory {
                    requested: 5,
                    available: 4,
                }),
            ),
            (Kind::ModuleLoad, Err(OpError::Unsupported("ptx".into()))),
            (Kind::Free, Err(OpError::NotFound("x".into()))),
            (Kind::Copy, Err(OpError::OutOfRange { addr: 1, len: 2 })),
            (Kind::Upload, Err(OpError::Fault(3))),
            (Kind::Launch, Err(OpError::Device("failed".into()))),
            (Kind::Launch, Err(OpError::Lost("context gone".into()))),
            (
                Kind::Launch,
                Err(OpError::KernelFault("illegal address".into())),
            ),
            (
                Kind::Launch,
                Err(OpError::KernelAssert("say: assertion failed".into())),
            ),
        ];
        for (kind, result) in cases {
            let reply = Reply {
                memory_used: 4096,
                result,
            };
            let payload = reply.encode(kind);
            assert_eq!(Reply::decode(kind, &payload).unwrap(), reply);
            for cut in 0..payload.len() {
                assert!(Reply::decode(kind, &payload[..cut]).is_err(), "{kind:?}");
            }
            let mut long = payload.clone();
            long.push(0);
            assert!(Reply::decode(kind, &long).is_err());
        }
    }

    #[test]
    fn test_bad_replies_are_refused() {
        // Unknown status.
        let mut w = Writer::default();
        w.u8(42).u64(0);
        assert_eq!(
            Reply::decode(Kind::Free, &w.0),
            Err(ProtoError::Malformed("unknown status"))
        );
        // Error text over the bound.
        let mut w = Writer::default();
        w.u8(ERR_DEVICE).u64(0).u16(MAX_TEXT as u16 + 1);
        w.0.extend(std::iter::repeat_n(b'a', MAX_TEXT + 1));
        assert_eq!(
            Reply::decode(Kind::Free, &w.0),
            Err(ProtoError::Malformed("text too long"))
        );
        // A reset flag that is neither 0 nor 1.
        let mut w = Writer::default();
        w.u8(0).u64(0).u8(2);
        assert!(Reply::decode(Kind::Reset, &w.0).is_err());
        // Replies are never callbacks.
        let mut w = Writer::default();
        w.u8(0).u64(0);
        assert!(Reply::decode(Kind::Need, &w.0).is_err());
        // Answers.
        assert_eq!(decode_answer(&encode_answer(None)), Ok(None));
        assert_eq!(decode_answer(&encode_answer(Some(9))), Ok(Some(9)));
        assert!(decode_answer(&[2]).is_err());
        assert!(decode_answer(&[0, 0]).is_err());
        let p = Piece {
            offset: 3,
            len: 4,
            at: 5,
        };
        assert_eq!(Piece::decode(&p.encode()), Ok(p));
        assert!(Piece::decode(&[0; 23]).is_err());
        assert!(Piece::decode(&[0; 25]).is_err());
    }

    #[test]
    fn test_long_text_is_cut_at_a_character_boundary() {
        let s = "é".repeat(MAX_TEXT);
        let mut w = Writer::default();
        w.text(&s, MAX_TEXT);
        let mut r = Reader::new(&w.0);
        let t = r.text(MAX_TEXT).unwrap();
        assert!(t.len() <= MAX_TEXT && t.chars().all(|c| c == 'é'));
    }
}
