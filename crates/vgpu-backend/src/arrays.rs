//! CUDA arrays, texture and surface objects (ABI 1.6): the requests as
//! the device decodes them and the checks every backend applies, so a
//! request the software backend refuses is refused the same way before a
//! GPU's driver sees it.
//!
//! The guest's values are hostile: every size is bounded by the ABI's
//! limits (the largest dimensions any CUDA GPU of compute capability 5.0
//! or later takes) before a byte is allocated, and every box of a copy
//! is checked against both sides.

use vgpu_abi as abi;
use vgpu_abi::ByteValued;
use vgpu_ptx::texture::Descriptor;
/// An element type (CUDA's `CUarray_format`).
pub use vgpu_ptx::texture::Format;

use crate::OpError;

/// A request about arrays, textures or surfaces, as the guest sent it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Resource {
    /// ARRAY_CREATE: the result is the array's handle.
    ArrayCreate(abi::ArrayCmd),
    /// ARRAY_COPY.
    ArrayCopy(abi::ArrayCopyCmd),
    /// OBJECT_CREATE: the result is the object's handle.
    ObjectCreate(abi::ObjectCmd),
    /// OBJECT_DESTROY.
    Destroy(abi::ObjectDestroyCmd),
}

fn parse<T: ByteValued + Default>(bytes: &[u8]) -> Result<T, OpError> {
    let mut v = T::default();
    let n = std::mem::size_of::<T>();
    if bytes.len() < n {
        return Err(OpError::Invalid(format!(
            "command of {} bytes, {n} expected",
            bytes.len()
        )));
    }
    v.as_mut_slice().copy_from_slice(&bytes[..n]);
    Ok(v)
}

impl Resource {
    /// The request of a command's bytes (opcode in its header).
    pub fn from_bytes(bytes: &[u8]) -> Result<Resource, OpError> {
        let hdr: abi::CmdHeader = parse(bytes)?;
        Ok(match hdr.opcode {
            abi::OP_ARRAY_CREATE => Resource::ArrayCreate(parse(bytes)?),
            abi::OP_ARRAY_COPY => Resource::ArrayCopy(parse(bytes)?),
            abi::OP_OBJECT_CREATE => Resource::ObjectCreate(parse(bytes)?),
            abi::OP_OBJECT_DESTROY => Resource::Destroy(parse(bytes)?),
            op => {
                return Err(OpError::Invalid(format!(
                    "opcode {op} is no resource request"
                )))
            }
        })
    }

    /// The command's bytes, its header's opcode saying which.
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            Resource::ArrayCreate(c) => c.as_slice().to_vec(),
            Resource::ArrayCopy(c) => c.as_slice().to_vec(),
            Resource::ObjectCreate(c) => c.as_slice().to_vec(),
            Resource::Destroy(c) => c.as_slice().to_vec(),
        }
    }

    /// The command's opcode-specific flags (without the context).
    pub fn flags(&self) -> u32 {
        let hdr = match self {
            Resource::ArrayCreate(c) => c.hdr,
            Resource::ArrayCopy(c) => c.hdr,
            Resource::ObjectCreate(c) => c.hdr,
            Resource::Destroy(c) => c.hdr,
        };
        hdr.flags & !abi::CMD_CTX_MASK
    }
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, OpError> {
    Err(OpError::Invalid(msg.into()))
}

/// The element type of a `FORMAT_*` and a channel count.
pub fn element(format: u32, channels: u32) -> Result<(Format, u32), OpError> {
    let Some(f) = Format::from_code(format) else {
        return invalid(format!("array format {format:#x}"));
    };
    if !matches!(channels, 1 | 2 | 4) {
        return invalid(format!("{channels} channels (1, 2 or 4)"));
    }
    Ok((f, channels))
}

/// An array as ARRAY_CREATE described it, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayDesc {
    /// Element type of each channel.
    pub format: Format,
    /// Channels: 1, 2 or 4.
    pub channels: u32,
    /// Elements along x.
    pub width: u64,
    /// Elements along y (0: 1D).
    pub height: u64,
    /// Elements along z, or layers (0: 1D or 2D).
    pub depth: u64,
    /// `depth` counts layers (of six faces, for a cubemap).
    pub layered: bool,
    /// A cubemap: its layers are faces, six a cube.
    pub cubemap: bool,
    /// Surface objects may be made over it.
    pub surface: bool,
}

impl ArrayDesc {
    /// Checks an ARRAY_CREATE as CUDA's `cuArray3DCreate` does, within
    /// the ABI's limits.
    pub fn of(cmd: &abi::ArrayCmd) -> Result<ArrayDesc, OpError> {
        let flags = cmd.hdr.flags & !abi::CMD_CTX_MASK;
        let known = abi::ARRAY_FLAG_LAYERED | abi::ARRAY_FLAG_SURFACE | abi::ARRAY_FLAG_CUBEMAP;
        if flags & !known != 0 {
            return Err(OpError::Unsupported(format!("array flags {flags:#x}")));
        }
        let (format, channels) = element(cmd.format, cmd.channels)?;
        let layered = flags & abi::ARRAY_FLAG_LAYERED != 0;
        let cubemap = flags & abi::ARRAY_FLAG_CUBEMAP != 0;
        let (w, h, d) = (cmd.width, cmd.height, cmd.depth);
        let fits = match (layered, h, d) {
            _ if w == 0 => false,
            // Square faces, six of them (a layer's worth each).
            _ if cubemap => {
                w == h
                    && w <= abi::MAX_ARRAY_CUBEMAP
                    && if layered {
                        d > 0 && d % 6 == 0 && d <= abi::MAX_CUBEMAP_FACES
                    } else {
                        d == 6
                    }
            }
            (false, 0, 0) => w <= abi::MAX_ARRAY_1D,
            (false, _, 0) => w <= abi::MAX_ARRAY_2D && h <= abi::MAX_ARRAY_2D,
            (false, 0, _) => false,
            (false, _, _) => [w, h, d].iter().all(|&x| x <= abi::MAX_ARRAY_3D),
            (true, _, 0) => false,
            (true, 0, _) => w <= abi::MAX_ARRAY_1D && d <= abi::MAX_ARRAY_LAYERS,
            (true, _, _) => {
                w <= abi::MAX_ARRAY_3D && h <= abi::MAX_ARRAY_3D && d <= abi::MAX_ARRAY_LAYERS
            }
        };
        if !fits {
            return invalid(format!(
                "array of {w} x {h} x {d}{}",
                if layered { " (layered)" } else { "" }
            ));
        }
        Ok(ArrayDesc {
            format,
            channels,
            width: w,
            height: h,
            depth: d,
            layered,
            cubemap,
            surface: flags & abi::ARRAY_FLAG_SURFACE != 0,
        })
    }

    /// Bytes of one element.
    pub fn elem_bytes(&self) -> u64 {
        u64::from(self.format.bytes()) * u64::from(self.channels)
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> u64 {
        self.width * self.elem_bytes()
    }

    /// Rows of a slice (or layer).
    pub fn rows(&self) -> u64 {
        self.height.max(1)
    }

    /// Slices (or layers).
    pub fn slices(&self) -> u64 {
        self.depth.max(1)
    }

    /// Bytes of the whole array, rows and slices packed.
    pub fn bytes(&self) -> u64 {
        // Bounded by the limits: at most 2^14 * 2^14 * 2^14 * 16 bytes.
        self.row_bytes() * self.rows() * self.slices()
    }

    /// The descriptor of a texture (or surface) over the array, packed as
    /// [`ArrayDesc::bytes`] says, at `addr`.
    pub fn descriptor(&self, addr: u64, surface: bool) -> Descriptor {
        Descriptor {
            surface,
            format: self.format,
            channels: self.channels,
            normalized: false,
            read_integer: false,
            linear_filter: false,
            linear_memory: false,
            // A cubemap's faces are its layers.
            layered: self.layered || self.cubemap,
            cubemap: self.cubemap,
            addr,
            extent: [self.width, self.rows(), self.slices()].map(|x| x as u32),
            pitch: self.row_bytes(),
            slice: self.row_bytes() * self.rows(),
            address: [vgpu_ptx::texture::ADDRESS_CLAMP; 3],
            border: [0.0; 4],
        }
    }
}

/// One side of an ARRAY_COPY.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopySide {
    /// Array handle or device address.
    pub at: u64,
    /// An array.
    pub array: bool,
    /// Device memory: bytes per row.
    pub pitch: u64,
    /// Device memory: rows per slice.
    pub height: u64,
    /// Where the box starts: byte, row, slice.
    pub pos: [u64; 3],
}

impl CopySide {
    /// Where device memory's box starts and how many bytes it spans, for
    /// a box of `extent`; an error where the numbers overflow or the rows
    /// overlap.
    pub fn span(&self, extent: [u64; 3]) -> Result<(u64, u64), OpError> {
        let [x, y, z] = self.pos;
        let [w, h, d] = extent;
        if (h > 1 || d > 1) && self.pitch < x + w {
            return invalid(format!("pitch {} shorter than the rows", self.pitch));
        }
        if d > 1 && self.height < y + h {
            return invalid(format!(
                "{} rows per slice, fewer than the box",
                self.height
            ));
        }
        let slice = self.pitch.checked_mul(self.height);
        let start = slice
            .and_then(|s| s.checked_mul(z))
            .and_then(|o| o.checked_add(y.checked_mul(self.pitch)?))
            .and_then(|o| o.checked_add(x));
        let len = slice
            .and_then(|s| s.checked_mul(d - 1))
            .and_then(|o| o.checked_add((h - 1).checked_mul(self.pitch)?))
            .and_then(|o| o.checked_add(w));
        match (start, len) {
            (Some(s), Some(l)) => Ok((self.at.checked_add(s).ok_or_else(overflow)?, l)),
            _ => Err(overflow()),
        }
    }

    /// Checks that the box fits `array`.
    pub fn check_array(&self, array: &ArrayDesc, extent: [u64; 3]) -> Result<(), OpError> {
        let limits = [array.row_bytes(), array.rows(), array.slices()];
        for ((p, e), l) in self.pos.iter().zip(extent).zip(limits) {
            if p + e > l {
                return invalid(format!(
                    "box at {:?} of {extent:?} outside an array of {limits:?}",
                    self.pos
                ));
            }
        }
        if !self.pos[0].is_multiple_of(array.elem_bytes())
            || !extent[0].is_multiple_of(array.elem_bytes())
        {
            return invalid("box not in whole elements");
        }
        Ok(())
    }
}

fn overflow() -> OpError {
    OpError::Invalid("copy box overflows".into())
}

/// An ARRAY_COPY, checked for shape (each side against its array or
/// allocation is the backend's to check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrayCopy {
    /// Where from.
    pub src: CopySide,
    /// Where to.
    pub dst: CopySide,
    /// Bytes, rows, slices.
    pub extent: [u64; 3],
}

impl ArrayCopy {
    /// Checks an ARRAY_COPY's flags and shape.
    pub fn of(cmd: &abi::ArrayCopyCmd) -> Result<ArrayCopy, OpError> {
        let flags = cmd.hdr.flags & !abi::CMD_CTX_MASK;
        if flags & !(abi::ARRAY_COPY_SRC_ARRAY | abi::ARRAY_COPY_DST_ARRAY) != 0
            || cmd.reserved != 0
        {
            return invalid(format!("array copy flags {flags:#x}"));
        }
        let extent = cmd.extent.map(u64::from);
        if extent.contains(&0) {
            return invalid("empty copy box");
        }
        let side = |at, array: bool, pitch: u32, height: u32, pos: [u32; 3]| {
            if array && (pitch != 0 || height != 0) {
                return invalid("an array side has no pitch");
            }
            Ok(CopySide {
                at,
                array,
                pitch: pitch.into(),
                height: height.into(),
                pos: pos.map(u64::from),
            })
        };
        let src = side(
            cmd.src,
            flags & abi::ARRAY_COPY_SRC_ARRAY != 0,
            cmd.src_pitch,
            cmd.src_height,
            cmd.src_pos,
        )?;
        let dst = side(
            cmd.dst,
            flags & abi::ARRAY_COPY_DST_ARRAY != 0,
            cmd.dst_pitch,
            cmd.dst_height,
            cmd.dst_pos,
        )?;
        if !src.array && !dst.array {
            return invalid("an array copy needs an array");
        }
        Ok(ArrayCopy { src, dst, extent })
    }
}

/// What an OBJECT_CREATE makes, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObjectDesc {
    /// A surface object (else a texture object).
    pub surface: bool,
    /// `RESOURCE_*`.
    pub res_type: u32,
    /// The array handle or device address.
    pub resource: u64,
    /// Memory resources: element type and channels.
    pub element: Option<(Format, u32)>,
    /// Linear memory: bytes; pitched: the pitch.
    pub size: u64,
    /// Pitched memory: elements per row and rows.
    pub width: u32,
    /// Pitched memory: rows.
    pub height: u32,
    /// Textures: address modes of x, y, z.
    pub address: [u8; 3],
    /// Textures: linear filtering.
    pub linear_filter: bool,
    /// Textures: `TEX_*` flags.
    pub tex_flags: u32,
    /// Textures: border colour.
    pub border: [f32; 4],
}

/// Alignment of a texture's device memory: that of every allocation
/// (libcuda reports 512, as a GPU does, which this accepts too).
pub const TEXTURE_ALIGNMENT: u64 = abi::ALLOC_DEFAULT_ALIGN;
/// Alignment of a pitched texture's pitch
/// (`CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT`).
pub const TEXTURE_PITCH_ALIGNMENT: u64 = 32;
/// Most elements of a texture over linear memory (2^27, every GPU's
/// `MAXIMUM_TEXTURE1D_LINEAR_WIDTH` since compute capability 3.0).
pub const MAX_LINEAR_ELEMENTS: u64 = 1 << 27;

impl ObjectDesc {
    /// Checks an OBJECT_CREATE as `cuTexObjectCreate` and
    /// `cuSurfObjectCreate` do.
    pub fn of(cmd: &abi::ObjectCmd) -> Result<ObjectDesc, OpError> {
        let kind = cmd.hdr.flags & !abi::CMD_CTX_MASK;
        let surface = match kind {
            abi::OBJECT_TEXTURE => false,
            abi::OBJECT_SURFACE => true,
            k => return invalid(format!("object kind {k}")),
        };
        let address = cmd.address.to_le_bytes();
        if address[3] != 0
            || address[..3]
                .iter()
                .any(|&m| u32::from(m) > abi::ADDRESS_BORDER)
        {
            return invalid(format!("address modes {:#x}", cmd.address));
        }
        if cmd.filter > abi::FILTER_LINEAR {
            return invalid(format!("filter mode {}", cmd.filter));
        }
        let known = abi::TEX_READ_AS_INTEGER | abi::TEX_NORMALIZED_COORDINATES;
        if cmd.tex_flags & !known != 0 {
            return Err(OpError::Unsupported(format!(
                "texture flags {:#x}",
                cmd.tex_flags
            )));
        }
        if surface
            && (cmd.address != 0 || cmd.filter != 0 || cmd.tex_flags != 0 || cmd.border != [0.0; 4])
        {
            return invalid("a surface has no sampling state");
        }
        let element = match cmd.res_type {
            abi::RESOURCE_ARRAY => {
                if cmd.format != 0
                    || cmd.channels != 0
                    || cmd.size != 0
                    || cmd.width != 0
                    || cmd.height != 0
                {
                    return invalid("an array resource takes its shape from the array");
                }
                None
            }
            abi::RESOURCE_LINEAR | abi::RESOURCE_PITCH2D if surface => {
                return invalid("surfaces are made over arrays");
            }
            abi::RESOURCE_LINEAR => {
                let (f, c) = element(cmd.format, cmd.channels)?;
                let elem = u64::from(f.bytes()) * u64::from(c);
                if cmd.size < elem
                    || cmd.size / elem > MAX_LINEAR_ELEMENTS
                    || cmd.width != 0
                    || cmd.height != 0
                {
                    return invalid(format!("linear texture of {} bytes", cmd.size));
                }
                Some((f, c))
            }
            abi::RESOURCE_PITCH2D => {
                let (f, c) = element(cmd.format, cmd.channels)?;
                let row = u64::from(cmd.width) * u64::from(f.bytes()) * u64::from(c);
                if cmd.width == 0
                    || cmd.height == 0
                    || u64::from(cmd.width) > abi::MAX_ARRAY_2D
                    || u64::from(cmd.height) > abi::MAX_ARRAY_2D
                    || cmd.size < row
                    || !cmd.size.is_multiple_of(TEXTURE_PITCH_ALIGNMENT)
                {
                    return invalid(format!(
                        "pitched texture of {} x {}, pitch {}",
                        cmd.width, cmd.height, cmd.size
                    ));
                }
                Some((f, c))
            }
            t => return invalid(format!("resource type {t}")),
        };
        if element.is_some() && !cmd.resource.is_multiple_of(TEXTURE_ALIGNMENT) {
            return invalid(format!(
                "texture memory at {:#x}: not {TEXTURE_ALIGNMENT}-byte aligned",
                cmd.resource
            ));
        }
        Ok(ObjectDesc {
            surface,
            res_type: cmd.res_type,
            resource: cmd.resource,
            element,
            size: cmd.size,
            width: cmd.width,
            height: cmd.height,
            address: [address[0], address[1], address[2]],
            linear_filter: cmd.filter == abi::FILTER_LINEAR,
            tex_flags: cmd.tex_flags,
            border: cmd.border,
        })
    }

    /// The device memory a memory resource reads: start and bytes.
    pub fn memory_span(&self) -> Option<(u64, u64)> {
        let (f, c) = self.element?;
        let elem = u64::from(f.bytes()) * u64::from(c);
        Some(match self.res_type {
            abi::RESOURCE_LINEAR => (self.resource, self.size / elem * elem),
            _ => (
                self.resource,
                self.size * (u64::from(self.height) - 1) + u64::from(self.width) * elem,
            ),
        })
    }

    /// The descriptor the executor reads: over `array` (an array
    /// resource, at `addr`) or over the object's own memory.
    pub fn descriptor(&self, array: Option<(&ArrayDesc, u64)>) -> Descriptor {
        let mut d = match (array, self.element) {
            (Some((a, addr)), _) => a.descriptor(addr, self.surface),
            (None, Some((format, channels))) => {
                let elem = u64::from(format.bytes()) * u64::from(channels);
                let linear = self.res_type == abi::RESOURCE_LINEAR;
                let (w, h) = if linear {
                    ((self.size / elem) as u32, 1)
                } else {
                    (self.width, self.height)
                };
                Descriptor {
                    surface: self.surface,
                    format,
                    channels,
                    normalized: false,
                    read_integer: false,
                    linear_filter: false,
                    linear_memory: linear,
                    layered: false,
                    cubemap: false,
                    addr: self.resource,
                    extent: [w, h, 1],
                    pitch: if linear { self.size } else { self.size.max(1) },
                    slice: self.size * u64::from(h),
                    address: [vgpu_ptx::texture::ADDRESS_CLAMP; 3],
                    border: [0.0; 4],
                }
            }
            // `of` gives memory resources their element.
            (None, None) => unreachable!("an array resource without its array"),
        };
        if !self.surface {
            d.normalized = self.tex_flags & abi::TEX_NORMALIZED_COORDINATES != 0;
            d.read_integer = self.tex_flags & abi::TEX_READ_AS_INTEGER != 0;
            d.linear_filter = self.linear_filter;
            d.address = self.address;
            d.border = self.border;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(flags: u32, w: u64, h: u64, d: u64) -> abi::ArrayCmd {
        abi::ArrayCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_ARRAY_CREATE,
                flags,
            },
            format: abi::FORMAT_F32,
            channels: 4,
            width: w,
            height: h,
            depth: d,
        }
    }

    #[test]
    fn array_shapes_follow_cuda() {
        let ok = |c: abi::ArrayCmd| ArrayDesc::of(&c).is_ok();
        assert!(ok(array(0, 1, 0, 0)));
        assert!(ok(array(0, abi::MAX_ARRAY_1D, 0, 0)));
        assert!(!ok(array(0, abi::MAX_ARRAY_1D + 1, 0, 0)));
        assert!(!ok(array(0, 0, 4, 0)));
        assert!(!ok(array(0, 4, 0, 4)));
        assert!(ok(array(0, 4, 4, 4)));
        assert!(!ok(array(0, abi::MAX_ARRAY_3D + 1, 4, 4)));
        assert!(ok(array(abi::ARRAY_FLAG_LAYERED, 4, 0, 3)));
        assert!(!ok(array(abi::ARRAY_FLAG_LAYERED, 4, 4, 0)));
        assert!(!ok(array(
            abi::ARRAY_FLAG_LAYERED,
            4,
            4,
            abi::MAX_ARRAY_LAYERS + 1
        )));
        assert!(ArrayDesc::of(&array(8, 4, 4, 0)).is_err());
        let cube = abi::ARRAY_FLAG_CUBEMAP;
        assert!(ok(array(cube, 8, 8, 6)));
        assert!(!ok(array(cube, 8, 4, 6)));
        assert!(!ok(array(cube, 8, 8, 12)));
        assert!(ok(array(cube | abi::ARRAY_FLAG_LAYERED, 8, 8, 12)));
        assert!(!ok(array(cube | abi::ARRAY_FLAG_LAYERED, 8, 8, 13)));
        let c = ArrayDesc::of(&array(cube, 8, 8, 6)).unwrap();
        assert!(!c.layered && c.cubemap && c.descriptor(0, false).layered);
        let mut bad = array(0, 4, 4, 0);
        bad.channels = 3;
        assert!(ArrayDesc::of(&bad).is_err());
        bad.channels = 1;
        bad.format = 0x11;
        assert!(ArrayDesc::of(&bad).is_err());
        let a = ArrayDesc::of(&array(abi::ARRAY_FLAG_LAYERED, 5, 3, 2)).unwrap();
        assert_eq!(
            (a.row_bytes(), a.rows(), a.slices(), a.bytes()),
            (80, 3, 2, 480)
        );
        // The largest arrays' sizes do not overflow.
        let big = ArrayDesc::of(&array(0, 16384, 16384, 16384)).unwrap();
        assert_eq!(big.bytes(), 1 << 46);
    }

    #[test]
    fn copy_boxes_are_checked() {
        let side = CopySide {
            at: 0x1000,
            array: false,
            pitch: 64,
            height: 4,
            pos: [8, 1, 1],
        };
        assert_eq!(
            side.span([16, 2, 2]),
            Ok((0x1000 + 256 + 64 + 8, 256 + 64 + 16))
        );
        assert!(side.span([60, 2, 1]).is_err());
        assert!(side.span([16, 4, 2]).is_err());
        let huge = CopySide {
            pitch: u64::from(u32::MAX),
            height: u64::from(u32::MAX),
            pos: [0, 0, u64::from(u32::MAX)],
            ..side
        };
        assert!(huge.span([1, 1, 1]).is_err());
        let a = ArrayDesc::of(&array(0, 4, 4, 0)).unwrap();
        let at = CopySide {
            array: true,
            pitch: 0,
            height: 0,
            pos: [16, 1, 0],
            ..side
        };
        assert!(at.check_array(&a, [48, 3, 1]).is_ok());
        assert!(at.check_array(&a, [64, 3, 1]).is_err());
        assert!(at.check_array(&a, [48, 3, 2]).is_err());
        assert!(at.check_array(&a, [47, 3, 1]).is_err());
    }

    #[test]
    fn objects_are_checked() {
        let tex = abi::ObjectCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_OBJECT_CREATE,
                flags: abi::OBJECT_TEXTURE,
            },
            resource: 0x2000,
            size: 4096,
            res_type: abi::RESOURCE_LINEAR,
            format: abi::FORMAT_F32,
            channels: 1,
            ..Default::default()
        };
        let d = ObjectDesc::of(&tex).unwrap();
        assert_eq!(d.memory_span(), Some((0x2000, 4096)));
        assert_eq!(d.descriptor(None).extent, [1024, 1, 1]);
        assert!(ObjectDesc::of(&abi::ObjectCmd {
            resource: 0x2004,
            ..tex
        })
        .is_err());
        assert!(ObjectDesc::of(&abi::ObjectCmd { address: 4, ..tex }).is_err());
        assert!(ObjectDesc::of(&abi::ObjectCmd { filter: 2, ..tex }).is_err());
        assert!(ObjectDesc::of(&abi::ObjectCmd {
            tex_flags: 0x10,
            ..tex
        })
        .is_err());
        let mut surf = tex;
        surf.hdr.flags = abi::OBJECT_SURFACE;
        assert!(ObjectDesc::of(&surf).is_err());
        let pitched = abi::ObjectCmd {
            res_type: abi::RESOURCE_PITCH2D,
            width: 10,
            height: 3,
            size: 64,
            ..tex
        };
        let d = ObjectDesc::of(&pitched).unwrap();
        assert_eq!(d.memory_span(), Some((0x2000, 128 + 40)));
        assert!(ObjectDesc::of(&abi::ObjectCmd {
            size: 48,
            ..pitched
        })
        .is_err());
        assert!(ObjectDesc::of(&abi::ObjectCmd {
            size: 96,
            width: 30,
            ..pitched
        })
        .is_err());
    }
}
