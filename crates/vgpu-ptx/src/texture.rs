//! Texture and surface objects: the descriptor a backend keeps in device
//! memory for each, and the sampling, loads and stores of `tex`, `suld`
//! and `sust` over it.
//!
//! A kernel names an object by a 64-bit handle. Here the handle is the
//! device address of the object's [`Descriptor`] ([`DESCRIPTOR_BYTES`]
//! bytes with a magic word), so the executor needs nothing but the
//! memory it is lent: every read of a descriptor and of the texels it
//! names goes through the checked [`GlobalMemory`], and a handle that
//! names no descriptor is an illegal address, as on a GPU.
//!
//! Filtering follows the CUDA programming guide's "Texture Fetching"
//! appendix: unnormalised coordinates `x` in `[0, N)` (normalised ones
//! are scaled by `N`), nearest-point sampling takes texel `floor(x)`,
//! linear filtering mixes texels `floor(x - 0.5)` and the next with the
//! weight `frac(x - 0.5)` held, as the hardware holds it, in 8 fraction
//! bits. Wrap and mirror apply to normalised coordinates only (the
//! others clamp, as CUDA documents).

use crate::half::f16_to_f32;
use crate::mem::{Fault, GlobalMemory};

/// Magic word of a texture object's descriptor ("VTEX").
pub const TEXTURE_MAGIC: u32 = 0x5845_5456;
/// Magic word of a surface object's descriptor ("VSRF").
pub const SURFACE_MAGIC: u32 = 0x4652_5356;
/// Bytes of a descriptor in device memory.
pub const DESCRIPTOR_BYTES: usize = 80;

/// Address mode (CUDA's numbers): wrap around.
pub const ADDRESS_WRAP: u8 = 0;
/// Address mode: clamp to the edge.
pub const ADDRESS_CLAMP: u8 = 1;
/// Address mode: mirror.
pub const ADDRESS_MIRROR: u8 = 2;
/// Address mode: the border colour outside.
pub const ADDRESS_BORDER: u8 = 3;

/// An element type of a texture or surface (CUDA's `CUarray_format`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    U8,
    U16,
    U32,
    S8,
    S16,
    S32,
    F16,
    F32,
}

impl Format {
    /// The format of CUDA's `CUarray_format` number.
    pub fn from_code(code: u32) -> Option<Format> {
        Some(match code {
            0x01 => Format::U8,
            0x02 => Format::U16,
            0x03 => Format::U32,
            0x08 => Format::S8,
            0x09 => Format::S16,
            0x0a => Format::S32,
            0x10 => Format::F16,
            0x20 => Format::F32,
            _ => return None,
        })
    }

    /// CUDA's number.
    pub fn code(self) -> u32 {
        match self {
            Format::U8 => 0x01,
            Format::U16 => 0x02,
            Format::U32 => 0x03,
            Format::S8 => 0x08,
            Format::S16 => 0x09,
            Format::S32 => 0x0a,
            Format::F16 => 0x10,
            Format::F32 => 0x20,
        }
    }

    /// Bytes of one channel.
    pub fn bytes(self) -> u32 {
        match self {
            Format::U8 | Format::S8 => 1,
            Format::U16 | Format::S16 | Format::F16 => 2,
            Format::U32 | Format::S32 | Format::F32 => 4,
        }
    }
}

/// What a texture or surface object describes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Descriptor {
    /// A surface object (else a texture object).
    pub surface: bool,
    /// Element type of each channel.
    pub format: Format,
    /// Channels: 1, 2 or 4.
    pub channels: u32,
    /// Coordinates in `[0, 1)`.
    pub normalized: bool,
    /// 8- and 16-bit integers read as they are (else as normalised floats).
    pub read_integer: bool,
    /// Linear filtering (else nearest point).
    pub linear_filter: bool,
    /// Linear memory (`tex1Dfetch`): an index out of range reads zero.
    pub linear_memory: bool,
    /// A layered array: `depth` is its layers.
    pub layered: bool,
    /// A cubemap (layered, six faces a cube): sampled by direction.
    pub cubemap: bool,
    /// Device address of element (0, 0, 0).
    pub addr: u64,
    /// Elements along x, y and z (or layers), each at least 1.
    pub extent: [u32; 3],
    /// Bytes from one row to the next.
    pub pitch: u64,
    /// Bytes from one slice (or layer) to the next.
    pub slice: u64,
    /// Address modes of x, y and z (`ADDRESS_*`).
    pub address: [u8; 3],
    /// Border colour.
    pub border: [f32; 4],
}

/// Why a texture or surface instruction failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TexFault {
    /// The handle names no descriptor of the right kind.
    BadHandle(u64),
    /// A texel's or the descriptor's bytes are not device memory.
    Memory(Fault),
    /// A surface access outside the surface in `.trap` mode.
    OutOfRange,
}

impl From<Fault> for TexFault {
    fn from(f: Fault) -> TexFault {
        TexFault::Memory(f)
    }
}

impl Descriptor {
    /// Bytes of one element.
    pub fn elem_bytes(&self) -> u64 {
        u64::from(self.format.bytes()) * u64::from(self.channels)
    }

    /// The descriptor as it lies in device memory.
    pub fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        let magic = if self.surface {
            SURFACE_MAGIC
        } else {
            TEXTURE_MAGIC
        };
        let flags = u32::from(self.normalized)
            | u32::from(self.read_integer) << 1
            | u32::from(self.linear_filter) << 2
            | u32::from(self.linear_memory) << 3
            | u32::from(self.layered) << 4
            | u32::from(self.cubemap) << 5;
        b[0..4].copy_from_slice(&magic.to_le_bytes());
        b[4..8].copy_from_slice(&self.format.code().to_le_bytes());
        b[8..12].copy_from_slice(&self.channels.to_le_bytes());
        b[12..16].copy_from_slice(&flags.to_le_bytes());
        b[16..24].copy_from_slice(&self.addr.to_le_bytes());
        for (i, e) in self.extent.iter().enumerate() {
            b[24 + 4 * i..28 + 4 * i].copy_from_slice(&e.to_le_bytes());
        }
        b[40..48].copy_from_slice(&self.pitch.to_le_bytes());
        b[48..56].copy_from_slice(&self.slice.to_le_bytes());
        b[56..59].copy_from_slice(&self.address);
        for (i, c) in self.border.iter().enumerate() {
            b[64 + 4 * i..68 + 4 * i].copy_from_slice(&c.to_le_bytes());
        }
        b
    }

    /// Decodes a descriptor; `None` unless its magic word, format,
    /// channels and sizes are sound (its bytes are device memory a
    /// kernel can write, so they are checked like any guest value).
    pub fn decode(b: &[u8; DESCRIPTOR_BYTES], surface: bool) -> Option<Descriptor> {
        let u32_at = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let u64_at = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let magic = if surface {
            SURFACE_MAGIC
        } else {
            TEXTURE_MAGIC
        };
        if u32_at(0) != magic {
            return None;
        }
        let format = Format::from_code(u32_at(4))?;
        let channels = u32_at(8);
        if !matches!(channels, 1 | 2 | 4) {
            return None;
        }
        let flags = u32_at(12);
        let extent = [u32_at(24), u32_at(28), u32_at(32)];
        if extent.contains(&0) || b[56..59].iter().any(|&m| m > ADDRESS_BORDER) {
            return None;
        }
        Some(Descriptor {
            surface,
            format,
            channels,
            normalized: flags & 1 != 0,
            read_integer: flags & 2 != 0,
            linear_filter: flags & 4 != 0,
            linear_memory: flags & 8 != 0,
            layered: flags & 16 != 0,
            cubemap: flags & 32 != 0,
            addr: u64_at(16),
            extent,
            pitch: u64_at(40),
            slice: u64_at(48),
            address: [b[56], b[57], b[58]],
            border: std::array::from_fn(|i| f32::from_bits(u32_at(64 + 4 * i))),
        })
    }

    /// Reads the descriptor a handle names.
    pub fn load(
        mem: &dyn GlobalMemory,
        handle: u64,
        surface: bool,
    ) -> Result<Descriptor, TexFault> {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        mem.read(handle, &mut b)
            .map_err(|_| TexFault::BadHandle(handle))?;
        Descriptor::decode(&b, surface).ok_or(TexFault::BadHandle(handle))
    }

    /// Whether the element type reads as floats: float formats, and 8-
    /// and 16-bit integers read as normalised floats.
    pub fn reads_float(&self) -> bool {
        match self.format {
            Format::F16 | Format::F32 => true,
            Format::U32 | Format::S32 => false,
            _ => !self.read_integer,
        }
    }

    /// Byte offset of element `(x, y, z)`, in range.
    fn offset(&self, at: [u32; 3]) -> u64 {
        // The pitches come from device memory a kernel may have written:
        // the sum wraps, and the access is checked like any other.
        u64::from(at[2])
            .wrapping_mul(self.slice)
            .wrapping_add(u64::from(at[1]).wrapping_mul(self.pitch))
            .wrapping_add(u64::from(at[0]) * self.elem_bytes())
    }

    /// The channels of the element at `at` (in range), as results: f32
    /// bits where the texture reads floats, else the integers (sign-
    /// extended); missing channels read 0, but the fourth reads 1.
    fn element(&self, mem: &dyn GlobalMemory, at: [u32; 3]) -> Result<[u32; 4], Fault> {
        let mut raw = [0u8; 16];
        let n = self.elem_bytes() as usize;
        mem.read(self.addr.wrapping_add(self.offset(at)), &mut raw[..n])?;
        let float = self.reads_float();
        let mut out = if float {
            [0, 0, 0, 1f32.to_bits()]
        } else {
            [0, 0, 0, 1]
        };
        let cb = self.format.bytes() as usize;
        for (c, o) in out.iter_mut().enumerate().take(self.channels as usize) {
            let b = &raw[c * cb..c * cb + cb];
            *o = match self.format {
                Format::U8 if float => (f32::from(b[0]) / 255.0).to_bits(),
                Format::S8 if float => (f32::from(b[0] as i8) / 127.0).max(-1.0).to_bits(),
                Format::U16 if float => {
                    (f32::from(u16::from_le_bytes([b[0], b[1]])) / 65535.0).to_bits()
                }
                Format::S16 if float => (f32::from(i16::from_le_bytes([b[0], b[1]])) / 32767.0)
                    .max(-1.0)
                    .to_bits(),
                Format::U8 => u32::from(b[0]),
                Format::S8 => b[0] as i8 as i32 as u32,
                Format::U16 => u32::from(u16::from_le_bytes([b[0], b[1]])),
                Format::S16 => i16::from_le_bytes([b[0], b[1]]) as i32 as u32,
                Format::F16 => f16_to_f32(u16::from_le_bytes([b[0], b[1]])).to_bits(),
                Format::U32 | Format::S32 | Format::F32 => {
                    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
                }
            };
        }
        Ok(out)
    }

    /// The border colour as results.
    fn border_value(&self) -> [u32; 4] {
        if self.reads_float() {
            self.border.map(f32::to_bits)
        } else {
            self.border.map(|c| c as i32 as u32)
        }
    }

    /// The texel index along dimension `d` of index `i`, by the address
    /// mode; `None` for the border.
    fn wrap(&self, d: usize, i: i64) -> Option<u32> {
        let n = i64::from(self.extent[d]);
        let mode = match self.address[d] {
            // Wrap and mirror need normalised coordinates.
            ADDRESS_WRAP | ADDRESS_MIRROR if !self.normalized => ADDRESS_CLAMP,
            m => m,
        };
        let i = match mode {
            ADDRESS_WRAP => i.rem_euclid(n),
            ADDRESS_MIRROR => {
                let m = i.rem_euclid(2 * n);
                if m >= n {
                    2 * n - 1 - m
                } else {
                    m
                }
            }
            ADDRESS_BORDER if !(0..n).contains(&i) => return None,
            _ => i.clamp(0, n - 1),
        };
        Some(i as u32)
    }

    /// `tex` of a texture of `dims` dimensions at float coordinates
    /// `c` (`layer` for a layered one, whose layers are its slices: a
    /// layered 1D texture's extent is `[width, 1, layers]`): the four
    /// results' bits.
    pub fn sample(
        &self,
        mem: &dyn GlobalMemory,
        dims: usize,
        layer: i32,
        c: [f32; 3],
    ) -> Result<[u32; 4], TexFault> {
        let z_layer = self.layer(layer);
        let mut x = [0f32; 3];
        for d in 0..dims {
            x[d] = if self.normalized {
                c[d] * self.extent[d] as f32
            } else {
                c[d]
            };
        }
        if !self.linear_filter || !self.reads_float() {
            let mut at = [0u32; 3];
            for d in 0..dims {
                match self.wrap(d, floor_i64(x[d])) {
                    Some(i) => at[d] = i,
                    None => return Ok(self.border_value()),
                }
            }
            if let Some(l) = z_layer {
                at[2] = l;
            }
            return Ok(self.element(mem, at)?);
        }
        // Linear: the 2^dims neighbours, weighted.
        let mut base = [0i64; 3];
        let mut frac = [0f32; 3];
        for d in 0..dims {
            let xb = x[d] - 0.5;
            let f = xb.floor();
            base[d] = f as i64;
            // The hardware keeps the weight in 8 fraction bits.
            frac[d] = ((xb - f) * 256.0).round() / 256.0;
        }
        let mut acc = [0f32; 4];
        for corner in 0..(1usize << dims) {
            let mut w = 1f32;
            let mut at = [0u32; 3];
            let mut border = false;
            for d in 0..dims {
                let hi = corner >> d & 1 == 1;
                w *= if hi { frac[d] } else { 1.0 - frac[d] };
                match self.wrap(d, base[d].saturating_add(i64::from(hi))) {
                    Some(i) => at[d] = i,
                    None => border = true,
                }
            }
            if w == 0.0 {
                continue;
            }
            if let Some(l) = z_layer {
                at[2] = l;
            }
            let v = if border {
                self.border_value()
            } else {
                self.element(mem, at)?
            };
            for (a, v) in acc.iter_mut().zip(v) {
                *a += w * f32::from_bits(v);
            }
        }
        Ok(acc.map(f32::to_bits))
    }

    /// `tex.cube` and `tex.acube` of a cubemap at direction `v` (cube
    /// `layer` of a layered one): the face the CUDA programming guide's
    /// table picks by the largest component, sampled at normalised
    /// `((sc / |m| + 1) / 2, (tc / |m| + 1) / 2)`, clamped to the face.
    pub fn sample_cube(
        &self,
        mem: &dyn GlobalMemory,
        layer: i32,
        v: [f32; 3],
    ) -> Result<[u32; 4], TexFault> {
        if !self.cubemap {
            return Err(TexFault::BadHandle(self.addr));
        }
        let [x, y, z] = v;
        let (ax, ay, az) = (x.abs(), y.abs(), z.abs());
        let (face, m, sc, tc) = if ax >= ay && ax >= az {
            if x >= 0.0 {
                (0, ax, -z, -y)
            } else {
                (1, ax, z, -y)
            }
        } else if ay >= az {
            if y >= 0.0 {
                (2, ay, x, z)
            } else {
                (3, ay, x, -z)
            }
        } else if z >= 0.0 {
            (4, az, x, -y)
        } else {
            (5, az, -x, -y)
        };
        let s = (sc / m + 1.0) / 2.0;
        let t = (tc / m + 1.0) / 2.0;
        let mut face_view = *self;
        face_view.normalized = true;
        face_view.address = [ADDRESS_CLAMP; 3];
        let index = i64::from(layer.max(0)) * 6 + face;
        let index = i32::try_from(index).unwrap_or(i32::MAX);
        face_view.sample(mem, 2, index, [s, t, 0.0])
    }

    /// `tex` at integer coordinates (`tex1Dfetch` and the like): no
    /// filtering; linear memory reads zero out of range.
    pub fn fetch(
        &self,
        mem: &dyn GlobalMemory,
        dims: usize,
        layer: i32,
        c: [i32; 3],
    ) -> Result<[u32; 4], TexFault> {
        let mut at = [0u32; 3];
        for d in 0..dims {
            let i = i64::from(c[d]);
            if self.linear_memory {
                if !(0..i64::from(self.extent[d])).contains(&i) {
                    return Ok([0; 4]);
                }
                at[d] = i as u32;
                continue;
            }
            match self.wrap(d, i) {
                Some(i) => at[d] = i,
                None => return Ok(self.border_value()),
            }
        }
        if let Some(l) = self.layer(layer) {
            at[2] = l;
        }
        Ok(self.element(mem, at)?)
    }

    /// The layer index of a layered texture, clamped to its layers.
    fn layer(&self, layer: i32) -> Option<u32> {
        self.layered
            .then(|| i64::from(layer).clamp(0, i64::from(self.extent[2]) - 1) as u32)
    }

    /// Where a surface access of `size` bytes at byte `c[0]`, row `c[1]`
    /// and slice or layer `c[2]` goes (`dims` of them, and the layer of a
    /// layered surface), by the out-of-range mode (`clamp`: the nearest
    /// element; `zero`: `None`; else an error).
    pub fn surface_at(
        &self,
        dims: usize,
        c: [i32; 3],
        size: u64,
        mode: SurfaceMode,
    ) -> Result<Option<u64>, TexFault> {
        let row = u64::from(self.extent[0]) * self.elem_bytes();
        let mut pos = [0u64; 3];
        let layer = self.layered.then_some(2);
        for d in (0..dims.min(3)).chain(layer) {
            let limit = if d == 0 {
                row.saturating_sub(size)
            } else {
                u64::from(self.extent[d]) - 1
            };
            let v = i64::from(c[d]);
            if v < 0 || v as u64 > limit || (d == 0 && size > row) {
                match mode {
                    SurfaceMode::Trap => return Err(TexFault::OutOfRange),
                    SurfaceMode::Zero => return Ok(None),
                    SurfaceMode::Clamp => {
                        pos[d] = if v < 0 { 0 } else { limit };
                        if d == 0 {
                            // The nearest whole element.
                            pos[d] -= pos[d] % self.elem_bytes().max(1);
                        }
                    }
                }
            } else {
                pos[d] = v as u64;
            }
        }
        if size > row {
            return Err(TexFault::OutOfRange);
        }
        let off = pos[2]
            .wrapping_mul(self.slice)
            .wrapping_add(pos[1].wrapping_mul(self.pitch))
            .wrapping_add(pos[0]);
        Ok(Some(self.addr.wrapping_add(off)))
    }

    /// `txq` / `suq`: width, height or depth (layers for a layered one).
    pub fn query(&self, what: Query) -> u32 {
        match what {
            Query::Width => self.extent[0],
            Query::Height => self.extent[1],
            Query::Depth => self.extent[2],
            Query::ChannelOrder | Query::ChannelType => self.format.code(),
            Query::NormalizedCoords => u32::from(self.normalized),
            Query::FilterMode => u32::from(self.linear_filter),
            Query::ArraySize => {
                if self.layered {
                    self.extent[2]
                } else {
                    0
                }
            }
        }
    }
}

/// What `txq` and `suq` ask.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    Width,
    Height,
    Depth,
    ChannelType,
    ChannelOrder,
    NormalizedCoords,
    FilterMode,
    ArraySize,
}

/// What a surface access outside the surface does (`suld`/`sust`'s
/// `.trap`, `.clamp`, `.zero`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SurfaceMode {
    /// A fault.
    Trap,
    /// The nearest element is accessed.
    Clamp,
    /// Loads read zero, stores are dropped.
    Zero,
}

fn floor_i64(x: f32) -> i64 {
    let f = x.floor();
    if f.is_nan() {
        0
    } else {
        f.clamp(i64::MIN as f32, i64::MAX as f32) as i64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    const BASE: u64 = 0x1000;

    fn desc_2d(w: u32, h: u32, linear: bool, normalized: bool, mode: u8) -> Descriptor {
        Descriptor {
            surface: false,
            format: Format::F32,
            channels: 1,
            normalized,
            read_integer: false,
            linear_filter: linear,
            linear_memory: false,
            layered: false,
            cubemap: false,
            addr: BASE,
            extent: [w, h, 1],
            pitch: u64::from(w) * 4,
            slice: u64::from(w * h) * 4,
            address: [mode, mode, mode],
            border: [-1.0, -2.0, -3.0, -4.0],
        }
    }

    fn image(w: u32, h: u32) -> (VecMemory, Vec<f32>) {
        let vals: Vec<f32> = (0..w * h).map(|i| (i * 7 % 13) as f32 + 0.25).collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        (VecMemory::from_bytes(BASE, &bytes), vals)
    }

    /// The reference: CUDA's formulas, written out for two dimensions.
    fn reference(
        vals: &[f32],
        w: i64,
        h: i64,
        x: f32,
        y: f32,
        linear: bool,
        wrap: impl Fn(i64, i64) -> Option<i64>,
    ) -> f32 {
        let at = |i: i64, j: i64| match (wrap(i, w), wrap(j, h)) {
            (Some(i), Some(j)) => vals[(j * w + i) as usize],
            _ => -1.0,
        };
        if !linear {
            return at(x.floor() as i64, y.floor() as i64);
        }
        let (xb, yb) = (x - 0.5, y - 0.5);
        let (i, j) = (xb.floor() as i64, yb.floor() as i64);
        let a = ((xb - xb.floor()) * 256.0).round() / 256.0;
        let b = ((yb - yb.floor()) * 256.0).round() / 256.0;
        (1.0 - a) * (1.0 - b) * at(i, j)
            + a * (1.0 - b) * at(i + 1, j)
            + (1.0 - a) * b * at(i, j + 1)
            + a * b * at(i + 1, j + 1)
    }

    #[test]
    fn descriptors_round_trip_and_refuse_garbage() {
        let d = desc_2d(5, 3, true, false, ADDRESS_BORDER);
        assert_eq!(Descriptor::decode(&d.encode(), false), Some(d));
        assert_eq!(Descriptor::decode(&d.encode(), true), None);
        let mut bad = d.encode();
        bad[8] = 3; // three channels
        assert_eq!(Descriptor::decode(&bad, false), None);
        let mut bad = d.encode();
        bad[24..28].copy_from_slice(&0u32.to_le_bytes());
        assert_eq!(Descriptor::decode(&bad, false), None);
        let mem = VecMemory::new(BASE, 64);
        assert_eq!(
            Descriptor::load(&mem, BASE, false),
            Err(TexFault::BadHandle(BASE))
        );
        assert_eq!(
            Descriptor::load(&mem, 0xdead_0000, false),
            Err(TexFault::BadHandle(0xdead_0000))
        );
    }

    #[test]
    fn point_and_linear_sampling_match_the_reference() {
        let (w, h) = (7u32, 5u32);
        let (mem, vals) = image(w, h);
        let clamp = |i: i64, n: i64| Some(i.clamp(0, n - 1));
        let border = |i: i64, n: i64| (0..n).contains(&i).then_some(i);
        for linear in [false, true] {
            for (mode, f) in [
                (ADDRESS_CLAMP, &clamp as &dyn Fn(i64, i64) -> Option<i64>),
                (ADDRESS_BORDER, &border),
            ] {
                let d = desc_2d(w, h, linear, false, mode);
                for k in 0..200 {
                    let x = -2.0 + (k as f32) * 0.061;
                    let y = -1.5 + (k as f32 * 0.037) % 8.0;
                    let got = f32::from_bits(d.sample(&mem, 2, 0, [x, y, 0.0]).unwrap()[0]);
                    let want = reference(&vals, w.into(), h.into(), x, y, linear, f);
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "linear {linear} mode {mode} at ({x}, {y}): {got} != {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn normalized_wrap_and_mirror() {
        let (w, h) = (4u32, 3u32);
        let (mem, vals) = image(w, h);
        let wrap = |i: i64, n: i64| Some(i.rem_euclid(n));
        let mirror = |i: i64, n: i64| {
            let m = i.rem_euclid(2 * n);
            Some(if m >= n { 2 * n - 1 - m } else { m })
        };
        for linear in [false, true] {
            for (mode, f) in [
                (ADDRESS_WRAP, &wrap as &dyn Fn(i64, i64) -> Option<i64>),
                (ADDRESS_MIRROR, &mirror),
            ] {
                let d = desc_2d(w, h, linear, true, mode);
                for k in 0..100 {
                    let u = -1.3 + k as f32 * 0.031;
                    let v = 2.2 - k as f32 * 0.027;
                    let got = f32::from_bits(d.sample(&mem, 2, 0, [u, v, 0.0]).unwrap()[0]);
                    let want = reference(&vals, 4, 3, u * 4.0, v * 3.0, linear, f);
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{mode} at ({u}, {v}): {got} != {want}"
                    );
                }
            }
            // Unnormalised coordinates clamp instead of wrapping.
            let d = desc_2d(w, h, false, false, ADDRESS_WRAP);
            let got = f32::from_bits(d.sample(&mem, 2, 0, [9.5, 1.5, 0.0]).unwrap()[0]);
            assert_eq!(got, vals[(w + 3) as usize]);
        }
    }

    #[test]
    fn integer_formats_read_normalized_or_as_integers() {
        let mem = VecMemory::from_bytes(BASE, &[0, 255, 128, 0x80, 1, 2, 3, 4]);
        let mut d = desc_2d(2, 1, false, false, ADDRESS_CLAMP);
        d.format = Format::U8;
        d.channels = 4;
        d.pitch = 8;
        let v = d.fetch(&mem, 1, 0, [0, 0, 0]).unwrap();
        let f = v.map(f32::from_bits);
        assert_eq!(f, [0.0, 1.0, 128.0 / 255.0, 128.0 / 255.0]);
        d.read_integer = true;
        assert_eq!(d.fetch(&mem, 1, 0, [1, 0, 0]).unwrap(), [1, 2, 3, 4]);
        d.format = Format::S8;
        assert_eq!(
            d.fetch(&mem, 1, 0, [0, 0, 0]).unwrap(),
            [0, u32::MAX, (-128i32) as u32, (-128i32) as u32]
        );
        d.read_integer = false;
        let f = d.fetch(&mem, 1, 0, [0, 0, 0]).unwrap().map(f32::from_bits);
        assert_eq!(f, [0.0, -1.0 / 127.0, -1.0, -1.0]);
        // Two channels: the third reads 0 and the fourth 1.
        d.format = Format::U16;
        d.channels = 2;
        d.read_integer = true;
        assert_eq!(
            d.fetch(&mem, 1, 0, [0, 0, 0]).unwrap(),
            [0xff00, 0x8080, 0, 1]
        );
    }

    #[test]
    fn linear_memory_reads_zero_out_of_range_and_layers_clamp() {
        let (mem, vals) = image(6, 1);
        let mut d = desc_2d(6, 1, false, false, ADDRESS_CLAMP);
        d.linear_memory = true;
        assert_eq!(d.fetch(&mem, 1, 0, [6, 0, 0]).unwrap(), [0; 4]);
        assert_eq!(d.fetch(&mem, 1, 0, [-1, 0, 0]).unwrap(), [0; 4]);
        assert_eq!(
            f32::from_bits(d.fetch(&mem, 1, 0, [5, 0, 0]).unwrap()[0]),
            vals[5]
        );
        // Three layers of two elements.
        let mut d = desc_2d(2, 1, false, false, ADDRESS_CLAMP);
        d.layered = true;
        d.extent = [2, 1, 3];
        d.slice = 8;
        let at =
            |layer, x: f32| f32::from_bits(d.sample(&mem, 1, layer, [x, 0.0, 0.0]).unwrap()[0]);
        assert_eq!(at(1, 0.5), vals[2]);
        assert_eq!(at(2, 1.5), vals[5]);
        assert_eq!(at(7, 1.5), vals[5]);
        assert_eq!(at(-1, 0.2), vals[0]);
    }

    #[test]
    fn forged_descriptors_fault_or_read_but_never_panic() {
        // A kernel may write a descriptor's bytes: extremes everywhere.
        let mem = VecMemory::new(BASE, 256);
        let mut d = desc_2d(1, 1, true, false, ADDRESS_WRAP);
        d.extent = [u32::MAX; 3];
        d.pitch = u64::MAX;
        d.slice = u64::MAX;
        d.layered = true;
        d.addr = u64::MAX - 3;
        let d = Descriptor::decode(&d.encode(), false).unwrap();
        for c in [f32::MAX, f32::MIN, f32::NAN, f32::INFINITY, -0.0, 1e30] {
            let _ = d.sample(&mem, 3, i32::MIN, [c, c, c]);
            let _ = d.sample(&mem, 2, i32::MAX, [c, -c, c]);
        }
        for c in [i32::MIN, i32::MAX, 0, -1] {
            let _ = d.fetch(&mem, 3, c, [c, c, c]);
        }
        let mut s = d;
        s.surface = true;
        for mode in [SurfaceMode::Trap, SurfaceMode::Clamp, SurfaceMode::Zero] {
            let _ = s.surface_at(2, [i32::MAX, i32::MIN, i32::MAX], 8, mode);
            let _ = s.surface_at(3, [-1, 1, 1 << 30], 16, mode);
        }
        // The reads go through the checked memory: outside it, faults.
        assert!(d.fetch(&mem, 2, 0, [5, 5, 0]).is_err());
    }

    #[test]
    fn cubemaps_pick_the_face_of_the_largest_component() {
        // Six 2 x 2 faces; texel (i, j) of face f holds 100 f + 10 j + i.
        let vals: Vec<f32> = (0..24)
            .map(|k| (100 * (k / 4) + 10 * ((k / 2) % 2) + k % 2) as f32)
            .collect();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mem = VecMemory::from_bytes(BASE, &bytes);
        let mut d = desc_2d(2, 2, false, false, ADDRESS_CLAMP);
        d.layered = true;
        d.cubemap = true;
        d.extent = [2, 2, 6];
        // The direction to texel (i, j) of face f, by the guide's table
        // read backwards.
        for f in 0..6u32 {
            for (i, j) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let sc = (i as f32 + 0.5) - 1.0;
                let tc = (j as f32 + 0.5) - 1.0;
                let v = match f {
                    0 => [1.0, -tc, -sc],
                    1 => [-1.0, -tc, sc],
                    2 => [sc, 1.0, tc],
                    3 => [sc, -1.0, -tc],
                    4 => [sc, -tc, 1.0],
                    _ => [-sc, -tc, -1.0],
                };
                let got = f32::from_bits(d.sample_cube(&mem, 0, v).unwrap()[0]);
                assert_eq!(
                    got,
                    (100 * f + 10 * j + i) as f32,
                    "face {f} texel ({i}, {j})"
                );
            }
        }
        d.cubemap = false;
        assert!(d.sample_cube(&mem, 0, [1.0, 0.0, 0.0]).is_err());
    }

    #[test]
    fn surface_modes() {
        let mut d = desc_2d(4, 2, false, false, ADDRESS_CLAMP);
        d.surface = true;
        assert_eq!(
            d.surface_at(2, [4, 1, 0], 4, SurfaceMode::Trap),
            Ok(Some(BASE + 16 + 4))
        );
        assert_eq!(
            d.surface_at(2, [16, 0, 0], 4, SurfaceMode::Trap),
            Err(TexFault::OutOfRange)
        );
        assert_eq!(d.surface_at(2, [0, 2, 0], 4, SurfaceMode::Zero), Ok(None));
        assert_eq!(
            d.surface_at(2, [99, -3, 0], 4, SurfaceMode::Clamp),
            Ok(Some(BASE + 12))
        );
        assert_eq!(
            d.surface_at(2, [0, 0, 0], 32, SurfaceMode::Clamp),
            Err(TexFault::OutOfRange)
        );
    }
}
