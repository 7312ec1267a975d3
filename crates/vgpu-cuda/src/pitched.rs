//! Pitched memory: copies of rows, slices and boxes between host and
//! device memory (2D and 3D copies, memcpy nodes), and memsets of rows.
//!
//! A region is rows of `width` bytes, `pitch` apart, in slices `slice`
//! apart. Rows that follow each other in both regions are merged, so a
//! copy between packed regions is one copy; the rest go to the device as
//! one command per row, gathered in batches. Copies with a CUDA array
//! are [`crate::arrays`]'.

use vgpu_guest::Batch;

use crate::allocs::range_device;
use crate::copies::{
    copy_across, in_page_locked, in_pinned, memset_work, side, submit_copy, Call, Side,
};
use crate::cu::{self, CUdevice, CUdeviceptr, CuResult, Handle, Memcpy2D, Memcpy3d, Memcpy3dSide};
use crate::graphs::Unsafe;
use crate::inflight::FLUSH_AT;
use crate::state::{driver, Driver};
use crate::work::Work;

/// `CUmemorytype`s a copy names its sides by (arrays are refused).
const MEMORYTYPE_ARRAY: u32 = 3;
const MEMORYTYPE_UNIFIED: u32 = 4;

/// Bytes of user memory one batch of row copies pins at most (the guest
/// driver refuses more than 256 MiB per batch).
const BATCH_BYTES: u64 = 64 << 20;

/// The rows of one side of a copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    /// Address of the first byte of the first row.
    base: u64,
    pitch: u64,
    /// Distance between slices (3D), `pitch` times the slice's rows.
    slice: u64,
}

/// How many rows of how many bytes, in how many slices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    width: u64,
    height: u64,
    depth: u64,
}

impl Shape {
    fn is_empty(&self) -> bool {
        self.width == 0 || self.height == 0 || self.depth == 0
    }
}

impl Region {
    /// The region at `(x, y, z)` of memory at `ptr`.
    fn at(
        ptr: u64,
        (x, y, z): (usize, usize, usize),
        pitch: usize,
        rows: usize,
    ) -> CuResult<Region> {
        let pitch = pitch as u64;
        let slice = pitch
            .checked_mul(rows as u64)
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        let off = (x as u64)
            .checked_add(pitch.checked_mul(y as u64).ok_or(cu::ERROR_INVALID_VALUE)?)
            .and_then(|o| o.checked_add(slice.checked_mul(z as u64)?))
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        let base = ptr.checked_add(off).ok_or(cu::ERROR_INVALID_VALUE)?;
        Ok(Region { base, pitch, slice })
    }

    /// The bytes from the first row's start to the last row's end, after
    /// checking that rows and slices do not overlap and that no address
    /// overflows (so every row's address can be computed unchecked).
    fn span(&self, shape: Shape) -> CuResult<u64> {
        let rows_fit = shape.height == 1 || shape.width <= self.pitch;
        let last_row = self.pitch.checked_mul(shape.height - 1);
        let slice_bytes = last_row.and_then(|r| r.checked_add(shape.width));
        let slices_fit = shape.depth == 1 || slice_bytes.is_some_and(|b| b <= self.slice);
        if !rows_fit || !slices_fit {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let span = self
            .slice
            .checked_mul(shape.depth - 1)
            .and_then(|s| s.checked_add(slice_bytes?))
            .ok_or(cu::ERROR_INVALID_VALUE)?;
        self.base.checked_add(span).ok_or(cu::ERROR_INVALID_VALUE)?;
        Ok(span)
    }

    /// Address of row `r` (counted across slices).
    fn row(&self, shape: Shape, r: u64) -> u64 {
        self.base + (r / shape.height) * self.slice + (r % shape.height) * self.pitch
    }
}

/// The copies of `shape` from `src` to `dst`, `(src, dst, len)`, rows
/// merged where both sides are contiguous. Both regions' spans must have
/// been checked.
fn segments(src: Region, dst: Region, shape: Shape) -> impl Iterator<Item = (u64, u64, u64)> {
    let rows = if shape.is_empty() {
        0
    } else {
        shape.height * shape.depth
    };
    let mut r = 0;
    std::iter::from_fn(move || {
        if r >= rows {
            return None;
        }
        let (s, d) = (src.row(shape, r), dst.row(shape, r));
        let mut len = shape.width;
        r += 1;
        while r < rows && src.row(shape, r) == s + len && dst.row(shape, r) == d + len {
            len += shape.width;
            r += 1;
        }
        Some((s, d, len))
    })
}

/// One side of a copy, resolved.
#[derive(Clone, Copy)]
enum End {
    Host(u64),
    Device(u64),
}

fn end(d: &Driver, kind: u32, host: u64, device: CUdeviceptr) -> CuResult<End> {
    match kind {
        cu::MEMORYTYPE_HOST => Ok(End::Host(host)),
        cu::MEMORYTYPE_DEVICE => Ok(End::Device(device)),
        // A unified address: the copy's pointer is in the device field.
        MEMORYTYPE_UNIFIED => Ok(match side(d, device, 1) {
            Side::Device => End::Device(device),
            Side::Host => End::Host(device),
        }),
        // Copies with an array are the device's (crate::arrays), and
        // not recorded in graphs.
        MEMORYTYPE_ARRAY => Err(d.not_supported_because("a copy of a CUDA array in a graph", "")),
        _ => Err(cu::ERROR_INVALID_VALUE),
    }
}

/// One side of a copy placed: its span, and its device if it is device
/// memory.
type Placed = (u64, Option<CUdevice>);

/// A copy of `shape` between two regions, each of host or device memory.
pub struct Copy3D {
    src: (End, Region),
    dst: (End, Region),
    shape: Shape,
}

impl Copy3D {
    /// The copy a `CUDA_MEMCPY3D` describes.
    pub fn of(d: &Driver, c: &Memcpy3d) -> CuResult<Copy3D> {
        Ok(Copy3D {
            src: side_3d(d, &c.src)?,
            dst: side_3d(d, &c.dst)?,
            shape: Shape {
                width: c.width_bytes as u64,
                height: c.height as u64,
                depth: c.depth as u64,
            },
        })
    }

    /// The copy a `CUDA_MEMCPY2D` describes.
    pub fn of_2d(d: &Driver, c: &Memcpy2D) -> CuResult<Copy3D> {
        let src = end(d, c.src_type, c.src_host as u64, c.src_device)?;
        let dst = end(d, c.dst_type, c.dst_host as u64, c.dst_device)?;
        let (sp, dp) = (ptr_of(src), ptr_of(dst));
        // One slice: its size is never used.
        Ok(Copy3D {
            src: (src, Region::at(sp, (c.src_x, c.src_y, 0), c.src_pitch, 0)?),
            dst: (dst, Region::at(dp, (c.dst_x, c.dst_y, 0), c.dst_pitch, 0)?),
            shape: Shape {
                width: c.width as u64,
                height: c.height as u64,
                depth: 1,
            },
        })
    }

    /// Each side's span (checked), and its device where it is device
    /// memory, whose whole span must then lie in one allocation.
    fn place(&self, d: &Driver) -> CuResult<(Placed, Placed)> {
        let side = |(e, r): (End, Region)| -> CuResult<Placed> {
            let span = r.span(self.shape)?;
            let dev = match e {
                End::Host(_) => None,
                End::Device(_) => Some(range_device(d, r.base, span as usize)?),
            };
            Ok((span, dev))
        };
        Ok((side(self.src)?, side(self.dst)?))
    }

    /// The copy as queued work of one device (a memcpy node, a capture):
    /// its rows between device memory, or between device memory and
    /// host memory: page-locked (which a graph replays without waiting)
    /// or pageable (copied between batches); host-to-host copies cannot
    /// be.
    pub fn works(&self, d: &Driver) -> CuResult<(CUdevice, Vec<Work>)> {
        if self.shape.is_empty() {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        let ((src_span, src_dev), (dst_span, dst_dev)) = self.place(d)?;
        let locked = |r: Region, span: u64| in_page_locked(d, r.base as usize, span as usize);
        let copies = segments(self.src.1, self.dst.1, self.shape);
        let (device, works): (CUdevice, Vec<Work>) = match (src_dev, dst_dev) {
            (Some(a), Some(b)) if a != b => return Err(cu::ERROR_NOT_SUPPORTED),
            (Some(dev), Some(_)) => (
                dev,
                copies
                    .map(|(src, dst, len)| Work::Copy { dst, src, len })
                    .collect(),
            ),
            // Pageable host memory is copied between batches instead.
            (None, Some(dev)) => {
                let pinned = locked(self.src.1, src_span);
                (
                    dev,
                    copies
                        .map(|(src, dst, len)| Work::Upload { dst, src, len })
                        .map(|w| if pinned { w } else { w.pageable() })
                        .collect(),
                )
            }
            (Some(dev), None) => {
                let pinned = locked(self.dst.1, dst_span);
                (
                    dev,
                    copies
                        .map(|(src, dst, len)| Work::Download { dst, src, len })
                        .map(|w| if pinned { w } else { w.pageable() })
                        .collect(),
                )
            }
            _ => {
                return Err(
                    d.not_supported_because("a copy in a graph", "host memory on both sides")
                )
            }
        };
        Ok((device, works))
    }

    /// Runs the copy on `stream`: recorded where an asynchronous call's
    /// stream is being captured, queued between device memory, else done
    /// by the time it returns, but for an asynchronous copy whose host
    /// side is pinned for the device, which is queued.
    pub fn run(&self, stream: Handle, call: Call) -> CuResult {
        let d = driver()?;
        if self.shape.is_empty() {
            return Ok(());
        }
        if call == Call::Async && d.objects().graphs().is_capturing(stream as usize) {
            // Recorded in the capture, where it can be.
            return match self.works(d) {
                Ok((device, works)) => d.queue(stream as usize, device, &works),
                Err(_) => d.refuse_in_capture(Unsafe::Stream(stream as usize)),
            };
        }
        let ((src_span, src_dev), (dst_span, dst_dev)) = self.place(d)?;
        let copies = segments(self.src.1, self.dst.1, self.shape);
        match (src_dev, dst_dev) {
            // Between two vGPUs: staged through host memory, row by row.
            (Some(from), Some(to)) if from != to => copy_across(to, from, copies, stream),
            (Some(device), Some(_)) => {
                let works = copies.map(|(src, dst, len)| Work::Copy { dst, src, len });
                queue_chunked(d, stream, device, works)
            }
            (None, Some(device)) => {
                let pinned = call == Call::Async
                    && in_pinned(d, self.src.1.base as usize, src_span as usize, device);
                user_copies(d, stream, device, pinned, copies, |b, src, dst, len| {
                    // SAFETY: `src` lies in the caller's source region,
                    // which stays mapped until the batch completes: it is
                    // page-locked memory freed only after the device's
                    // work, or the call waits for the batch below.
                    unsafe { b.copy_user_to_device_addr(dst, src as *const u8, len) };
                })
            }
            (Some(device), None) => {
                let pinned = call == Call::Async
                    && in_pinned(d, self.dst.1.base as usize, dst_span as usize, device);
                user_copies(d, stream, device, pinned, copies, |b, src, dst, len| {
                    // SAFETY: as above, for the caller's destination.
                    unsafe { b.copy_device_addr_to_user(dst as *mut u8, src, len) };
                })
            }
            (None, None) => {
                d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
                for (src, dst, len) in copies {
                    // SAFETY: both are the caller's host regions, whose
                    // rows the spans checked above cover.
                    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
                }
                Ok(())
            }
        }
    }
}

/// Queues `works` on `stream` in batches of at most [`FLUSH_AT`], so a
/// copy of many rows builds no list of them all.
fn queue_chunked(
    d: &Driver,
    stream: Handle,
    device: CUdevice,
    mut works: impl Iterator<Item = Work>,
) -> CuResult {
    loop {
        let chunk: Vec<Work> = works.by_ref().take(FLUSH_AT).collect();
        if chunk.is_empty() {
            return Ok(());
        }
        d.queue(stream as usize, device, &chunk)?;
    }
}

/// Copies between host memory of this process and the device, row by
/// row: queued behind the device's work when the host side is
/// page-locked and the call is asynchronous, else after the device's
/// work and waited for.
fn user_copies(
    d: &Driver,
    stream: Handle,
    device: CUdevice,
    pinned: bool,
    copies: impl Iterator<Item = (u64, u64, u64)>,
    add: impl Fn(&mut Batch, u64, u64, u64),
) -> CuResult {
    d.refuse_in_capture(Unsafe::Stream(stream as usize))?;
    let g = d.gpu(device)?;
    if !pinned {
        g.sync_legacy()?;
    }
    let lane = d.stream_lane(stream as usize)?;
    let (mut b, mut bytes) = (Batch::new(), 0u64);
    for (src, dst, len) in copies {
        if b.len() >= FLUSH_AT || bytes + len > BATCH_BYTES {
            let n = bytes as usize;
            submit_copy(g, lane, std::mem::take(&mut b), n)?;
            bytes = 0;
        }
        add(&mut b, src, dst, len);
        bytes += len;
    }
    if !b.is_empty() {
        submit_copy(g, lane, b, bytes as usize)?;
    }
    if pinned {
        Ok(())
    } else {
        // The copies went to the stream's lane: done once it is.
        g.sync_lane(lane)
    }
}

/// One side of a 3D copy, resolved.
fn side_3d(d: &Driver, s: &Memcpy3dSide) -> CuResult<(End, Region)> {
    if s.lod != 0 {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let e = end(d, s.memory_type, s.host as u64, s.device)?;
    let mut r = Region::at(0, (s.x_bytes, s.y, s.z), s.pitch, s.height)?;
    r.base = r
        .base
        .checked_add(ptr_of(e))
        .ok_or(cu::ERROR_INVALID_VALUE)?;
    Ok((e, r))
}

fn ptr_of(e: End) -> u64 {
    match e {
        End::Host(p) | End::Device(p) => p,
    }
}

/// Sets `height` rows of `width` elements of `elem` bytes, `pitch` apart.
pub fn memset_2d(
    dst: CUdeviceptr,
    pitch: usize,
    value: u32,
    elem: usize,
    (width, height): (usize, usize),
    stream: Handle,
) -> CuResult {
    let d = driver()?;
    let shape = Shape {
        width: (width as u64)
            .checked_mul(elem as u64)
            .ok_or(cu::ERROR_INVALID_VALUE)?,
        height: height as u64,
        depth: 1,
    };
    if shape.is_empty() {
        return Ok(());
    }
    // Aligned rows: each row's memset is then valid, as the span is.
    if !pitch.is_multiple_of(elem) || !dst.is_multiple_of(elem as u64) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    let region = Region::at(dst, (0, 0, 0), pitch, 0)?;
    let span = region.span(shape)?;
    let device = range_device(d, dst, span as usize)?;
    let mut failed = Ok(());
    let works = segments(region, region, shape).flat_map(|(addr, _, len)| {
        match memset_work(d, addr, value, elem, (len / elem as u64) as usize) {
            Ok(w) => w.map(|(_, w)| w).unwrap_or_default(),
            Err(e) => {
                failed = Err(e);
                Vec::new()
            }
        }
    });
    queue_chunked(d, stream, device, works)?;
    failed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(width: u64, height: u64, depth: u64) -> Shape {
        Shape {
            width,
            height,
            depth,
        }
    }

    fn region(base: u64, pitch: u64, slice: u64) -> Region {
        Region { base, pitch, slice }
    }

    #[test]
    fn packed_rows_merge_into_one_copy() {
        let s = shape(64, 8, 1);
        let (a, b) = (region(0x1000, 64, 0), region(0x9000, 64, 0));
        let v: Vec<_> = segments(a, b, s).collect();
        assert_eq!(v, vec![(0x1000, 0x9000, 512)]);
    }

    #[test]
    fn pitched_rows_copy_one_by_one() {
        let s = shape(10, 3, 1);
        let (a, b) = (region(0, 10, 0), region(0x100, 16, 0));
        let v: Vec<_> = segments(a, b, s).collect();
        assert_eq!(v, vec![(0, 0x100, 10), (10, 0x110, 10), (20, 0x120, 10)]);
    }

    #[test]
    fn slices_follow_their_own_pitch() {
        // Two slices of two rows; the source's slices are packed, the
        // destination's have a gap row.
        let s = shape(4, 2, 2);
        let (a, b) = (region(0, 4, 8), region(100, 4, 12));
        let v: Vec<_> = segments(a, b, s).collect();
        assert_eq!(v, vec![(0, 100, 8), (8, 112, 8)]);
    }

    #[test]
    fn empty_shapes_copy_nothing() {
        let r = region(0, 4, 4);
        assert_eq!(segments(r, r, shape(0, 4, 1)).count(), 0);
        assert_eq!(segments(r, r, shape(4, 0, 1)).count(), 0);
        assert_eq!(segments(r, r, shape(4, 1, 0)).count(), 0);
    }

    #[test]
    fn spans_refuse_overlap_and_overflow() {
        assert_eq!(region(0, 16, 0).span(shape(10, 3, 1)), Ok(42));
        // A pitch smaller than a row: rows would overlap.
        assert_eq!(
            region(0, 8, 0).span(shape(10, 3, 1)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        // One row needs no pitch.
        assert_eq!(region(0, 0, 0).span(shape(10, 1, 1)), Ok(10));
        // Slices smaller than their rows.
        assert_eq!(
            region(0, 16, 32).span(shape(10, 3, 2)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(region(0, 16, 48).span(shape(10, 3, 2)), Ok(90));
        // Past the end of the address space.
        assert_eq!(
            region(u64::MAX - 100, 64, 0).span(shape(10, 3, 1)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            region(0, u64::MAX / 2, 0).span(shape(10, 4, 1)),
            Err(cu::ERROR_INVALID_VALUE)
        );
    }

    #[test]
    fn regions_place_their_origin() {
        let r = Region::at(0x1000, (3, 2, 1), 64, 10).unwrap();
        assert_eq!(r, region(0x1000 + 3 + 128 + 640, 64, 640));
        assert_eq!(
            Region::at(u64::MAX, (1, 0, 0), 64, 1),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            Region::at(0, (0, usize::MAX, 0), 64, 1),
            Err(cu::ERROR_INVALID_VALUE)
        );
    }
}
