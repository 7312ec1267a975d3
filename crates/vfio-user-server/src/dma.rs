//! The DMA map table: the only way a device model reaches client (guest)
//! memory. Every access is checked against the mappings the client made,
//! their bounds and their read/write permission, like an IOMMU.
//!
//! Regions shared by fd are mapped into this process with `vm-memory`;
//! regions without an fd are reached through DMA_READ / DMA_WRITE requests
//! to the client (see [`ClientDma`]).

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use vm_memory::bitmap::BS;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::mmap::MmapRegionBuilder;
use vm_memory::{
    FileOffset, GuestAddress, GuestMemory, GuestMemoryError, GuestMemoryMmap, MmapRegion,
    Permissions, VolatileMemory, VolatileSlice,
};

use crate::proto::PAGE_SIZE;

/// A device access to client memory that the map table refused or that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// No mapping covers the address.
    #[error("no DMA mapping at {iova:#x}")]
    NotMapped {
        /// First unmapped address of the access.
        iova: u64,
    },
    /// The mapping does not allow this direction.
    #[error("DMA mapping at {iova:#x} does not allow {}", if *.write { "writes" } else { "reads" })]
    Permission {
        /// Address of the refused access.
        iova: u64,
        /// Whether the access was a write.
        write: bool,
    },
    /// The access wraps around the address space.
    #[error("DMA access at {iova:#x} of {len} bytes wraps around")]
    Overflow {
        /// Start of the access.
        iova: u64,
        /// Length of the access.
        len: usize,
    },
    /// The client answered a DMA_READ / DMA_WRITE with an error.
    #[error("client refused DMA at {iova:#x} (errno {errno})")]
    Client {
        /// Address of the access.
        iova: u64,
        /// The client's errno.
        errno: u32,
    },
    /// The client went away (or did not answer in time).
    #[error("client is gone")]
    Disconnected,
    /// The memory is reachable only through the client (no fd was shared),
    /// so it has no address in this process.
    #[error("DMA mapping at {iova:#x} has no host address")]
    NoHostAddress {
        /// Address of the access.
        iova: u64,
    },
}

/// Why a DMA_MAP or DMA_UNMAP request was refused; each maps to an errno.
#[derive(Debug, thiserror::Error)]
pub enum MapError {
    /// The request overlaps an existing mapping.
    #[error("range overlaps an existing mapping")]
    Exists,
    /// Zero size, unaligned, wrapping, or unknown flags.
    #[error("invalid range or flags: {0}")]
    Invalid(&'static str),
    /// An unmap would split a mapping.
    #[error("range would split the mapping at {0:#x}")]
    Split(u64),
    /// The table holds `max_dma_maps` entries already.
    #[error("too many DMA mappings")]
    TooMany,
    /// Mapping the fd failed.
    #[error("cannot map the region's fd")]
    Mmap(#[source] vm_memory::mmap::MmapRegionError),
}

impl MapError {
    /// The errno a reply carries for this error.
    pub fn errno(&self) -> u32 {
        (match self {
            MapError::Exists => libc::EEXIST,
            MapError::Invalid(_) | MapError::Split(_) => libc::EINVAL,
            MapError::TooMany => libc::ENOSPC,
            MapError::Mmap(_) => libc::EINVAL,
        }) as u32
    }
}

/// Reaches client memory that was not shared by fd, through the connection.
pub trait ClientDma: Send + Sync {
    /// Reads `buf.len()` bytes at `iova` (at most the client's transfer size).
    fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Writes `buf` at `iova` (at most the client's transfer size).
    fn dma_write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError>;
    /// Largest transfer one request may carry.
    fn max_transfer(&self) -> usize;
}

enum Backing {
    Mapped(MmapRegion),
    Client(Arc<dyn ClientDma>),
}

struct Mapping {
    id: u64,
    size: u64,
    readable: bool,
    writable: bool,
    backing: Backing,
}

impl Mapping {
    fn end(&self, iova: u64) -> u64 {
        // Cannot overflow: checked when the mapping was added.
        iova + self.size
    }

    /// Whether the client mapped it for this direction.
    fn allows(&self, write: bool) -> bool {
        if write {
            self.writable
        } else {
            self.readable
        }
    }
}

/// The mapping that contains `addr`, with its start.
fn mapping_at(table: &BTreeMap<u64, Mapping>, addr: u64) -> Option<(u64, &Mapping)> {
    table
        .range(..=addr)
        .next_back()
        .filter(|(&start, m)| m.end(start) > addr)
        .map(|(&start, m)| (start, m))
}

/// A DMA_MAP request, validated by [`DmaSpace::map`].
#[derive(Debug)]
pub struct MapRequest {
    /// Client address of the region.
    pub iova: u64,
    /// Size in bytes.
    pub size: u64,
    /// Whether the device may read it.
    pub readable: bool,
    /// Whether the device may write it.
    pub writable: bool,
    /// Offset of the region in `fd`.
    pub offset: u64,
}

/// A mapping added with an fd, reported to the device model: where the
/// client memory lies in this process and in its file, so that a model can
/// prepare it for direct device access (or hand the file to another
/// process).
#[derive(Debug, Clone)]
pub struct Mapped {
    /// Identifies the mapping until it is removed (see [`Unmapped::id`]);
    /// never reused by one [`DmaSpace`].
    pub id: u64,
    /// Client address of the region.
    pub iova: u64,
    /// Its size.
    pub size: u64,
    /// Whether the device may read it.
    pub readable: bool,
    /// Whether the device may write it.
    pub writable: bool,
    /// Address of its first byte in this process. It stays mapped until
    /// the model has been told of its removal.
    pub host_addr: usize,
    /// The file backing it.
    pub file: Arc<File>,
    /// Offset of its first byte in `file`.
    pub file_offset: u64,
}

/// A removed mapping, reported to the device model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unmapped {
    /// The mapping's id (as [`Mapped::id`]; fd-less mappings have ids too).
    pub id: u64,
    /// Client address of the removed region.
    pub iova: u64,
    /// Its size.
    pub size: u64,
}

/// Mappings taken out of the table. Their memory stays mapped in this
/// process until this is dropped, so that the device model can release
/// what it built on a host address (a driver registration) before the
/// address can be reused.
pub struct Removed {
    ranges: Vec<Unmapped>,
    _mappings: Vec<Mapping>,
}

impl Removed {
    /// The removed mappings, in address order.
    pub fn ranges(&self) -> &[Unmapped] {
        &self.ranges
    }

    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

impl std::fmt::Debug for Removed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.ranges).finish()
    }
}

/// A piece of fd-backed client memory as this process sees it, handed out
/// by [`DmaSpace::with_host_slices`] and valid only during that call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSlice {
    /// First byte.
    pub ptr: *mut u8,
    /// Length in bytes.
    pub len: usize,
    /// The mapping it lies in ([`Mapped::id`]).
    pub mapping: u64,
}

/// (st_dev, st_ino) of a file.
type FileId = (u64, u64);

/// The client memory one device may reach.
///
/// Shared (in an `Arc`) between the connection, which changes it, and the
/// device model's threads, which access memory through it. An access holds a
/// read lock on the table for the duration of its copy, so DMA_UNMAP, which
/// takes the write lock, completes only once no access uses the region.
pub struct DmaSpace {
    table: RwLock<BTreeMap<u64, Mapping>>,
    max_maps: RwLock<usize>,
    /// Files already backing mappings, by (device, inode): a client that
    /// maps one memfd page by page (QEMU with a guest IOMMU) sends the same
    /// file with every DMA_MAP, and keeping each fd open would exhaust the
    /// process's fd limit.
    files: Mutex<Vec<(FileId, Weak<File>)>>,
    /// The next mapping's id.
    next_id: AtomicU64,
}

impl Default for DmaSpace {
    fn default() -> Self {
        DmaSpace {
            table: RwLock::new(BTreeMap::new()),
            max_maps: RwLock::new(crate::proto::DEFAULT_MAX_DMA_MAPS as usize),
            files: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
        }
    }
}

impl DmaSpace {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    fn read_table(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Mapping>> {
        // A panic while holding the lock cannot leave the map inconsistent
        // (every update is a single insert/remove), so poisoning is ignored.
        vgpu_sys::sync::read(&self.table)
    }

    fn write_table(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Mapping>> {
        vgpu_sys::sync::write(&self.table)
    }

    /// The shared handle of `file`, reusing an open one for the same file.
    fn shared_file(&self, file: File, meta: &std::fs::Metadata) -> Arc<File> {
        use std::os::unix::fs::MetadataExt;
        let key = (meta.dev(), meta.ino());
        let mut files = vgpu_sys::lock(&self.files);
        files.retain(|(_, w)| w.strong_count() > 0);
        if let Some(existing) = files
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, w)| w.upgrade())
        {
            // `file` is a duplicate of an fd already held: close it.
            return existing;
        }
        let arc = Arc::new(file);
        files.push((key, Arc::downgrade(&arc)));
        arc
    }

    /// Sets the most mappings the table holds (the negotiated `max_dma_maps`).
    pub fn set_max_maps(&self, max: usize) {
        *vgpu_sys::sync::write(&self.max_maps) = max;
    }

    fn check_new(
        table: &BTreeMap<u64, Mapping>,
        max_maps: usize,
        req: &MapRequest,
    ) -> Result<(), MapError> {
        if req.size == 0 {
            return Err(MapError::Invalid("zero size"));
        }
        if !req.iova.is_multiple_of(PAGE_SIZE)
            || !req.size.is_multiple_of(PAGE_SIZE)
            || !req.offset.is_multiple_of(PAGE_SIZE)
        {
            return Err(MapError::Invalid("not page aligned"));
        }
        let end = req
            .iova
            .checked_add(req.size)
            .ok_or(MapError::Invalid("range wraps"))?;
        if !req.readable && !req.writable {
            return Err(MapError::Invalid("neither readable nor writable"));
        }
        if table.len() >= max_maps {
            return Err(MapError::TooMany);
        }
        // Overlap: the last mapping starting below `end` must end at or before `iova`.
        if let Some((&start, m)) = table.range(..end).next_back() {
            if m.end(start) > req.iova {
                return Err(MapError::Exists);
            }
        }
        Ok(())
    }

    /// Adds a mapping. With `fd`, the region is mapped into this process
    /// (shared, with the requested protection) and described in the
    /// result; without, accesses go to `client` and the result is `None`.
    pub fn map(
        &self,
        req: &MapRequest,
        fd: Option<File>,
        client: Arc<dyn ClientDma>,
    ) -> Result<Option<Mapped>, MapError> {
        let max_maps = *vgpu_sys::sync::read(&self.max_maps);
        // Validate before the (possibly slow) mmap, then again under the write lock.
        Self::check_new(&self.read_table(), max_maps, req)?;
        let backing = match fd {
            Some(file) => {
                let size = usize::try_from(req.size).map_err(|_| MapError::Invalid("too large"))?;
                // A mapping past the end of the file would turn a device
                // access into SIGBUS; only regular files (memfd, hugetlbfs,
                // files) have a length to check.
                let meta = file
                    .metadata()
                    .map_err(|_| MapError::Invalid("cannot stat the fd"))?;
                if !meta.is_file() {
                    return Err(MapError::Invalid("fd is not a regular file"));
                }
                let end = req
                    .offset
                    .checked_add(req.size)
                    .ok_or(MapError::Invalid("range wraps"))?;
                if end > meta.len() {
                    return Err(MapError::Invalid("range extends past the end of the fd"));
                }
                let mut prot = 0;
                if req.readable {
                    prot |= libc::PROT_READ;
                }
                if req.writable {
                    prot |= libc::PROT_WRITE;
                }
                let region = MmapRegionBuilder::new(size)
                    .with_file_offset(FileOffset::from_arc(
                        self.shared_file(file, &meta),
                        req.offset,
                    ))
                    .with_mmap_prot(prot)
                    .with_mmap_flags(libc::MAP_SHARED | libc::MAP_NORESERVE)
                    .build()
                    .map_err(MapError::Mmap)?;
                Backing::Mapped(region)
            }
            None => Backing::Client(client),
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mapped = match &backing {
            Backing::Mapped(region) => region.file_offset().map(|fo| Mapped {
                id,
                iova: req.iova,
                size: req.size,
                readable: req.readable,
                writable: req.writable,
                host_addr: region.as_ptr() as usize,
                file: fo.arc().clone(),
                file_offset: fo.start(),
            }),
            Backing::Client(_) => None,
        };
        let mut table = self.write_table();
        Self::check_new(&table, max_maps, req)?;
        table.insert(
            req.iova,
            Mapping {
                id,
                size: req.size,
                readable: req.readable,
                writable: req.writable,
                backing,
            },
        );
        Ok(mapped)
    }

    /// Removes every mapping inside `[iova, iova + size)`, as the kernel's
    /// VFIO type1 driver does: no mapping inside is fine, a mapping that
    /// straddles an edge is refused and nothing is removed. Returns the
    /// removed mappings once no access uses them any more; their memory is
    /// unmapped from this process when the result is dropped.
    pub fn unmap(&self, iova: u64, size: u64) -> Result<Removed, MapError> {
        if size == 0 {
            return Err(MapError::Invalid("zero size"));
        }
        // Inclusive end: a range may end exactly at 2^64 (QEMU unmaps up to
        // the top of the IOVA space when a guest IOMMU goes away).
        let last = iova
            .checked_add(size - 1)
            .ok_or(MapError::Invalid("range wraps"))?;
        let mut table = self.write_table();
        let mut victims = Vec::new();
        // A mapping starting below `iova` that reaches into the range straddles it.
        if let Some((&start, m)) = table.range(..iova).next_back() {
            if m.end(start) > iova {
                return Err(MapError::Split(start));
            }
        }
        for (&start, m) in table.range(iova..=last) {
            if m.end(start) - 1 > last {
                return Err(MapError::Split(start));
            }
            victims.push(Unmapped {
                id: m.id,
                iova: start,
                size: m.size,
            });
        }
        let mappings = victims
            .iter()
            .filter_map(|v| table.remove(&v.iova))
            .collect();
        Ok(Removed {
            ranges: victims,
            _mappings: mappings,
        })
    }

    /// Removes every mapping (see [`DmaSpace::unmap`]).
    pub fn unmap_all(&self) -> Removed {
        let mut table = self.write_table();
        let taken = std::mem::take(&mut *table);
        drop(table);
        let ranges = taken
            .iter()
            .map(|(&iova, m)| Unmapped {
                id: m.id,
                iova,
                size: m.size,
            })
            .collect();
        Removed {
            ranges,
            _mappings: taken.into_values().collect(),
        }
    }

    /// Calls `f` with the host slices of the client ranges `ranges`
    /// (address, length), in order, while the table is read-locked: every
    /// slice stays mapped and inside its mapping until `f` returns, and a
    /// DMA_UNMAP of it waits until then. So `f` must finish whatever it
    /// does with the slices (a device copy included) before it returns,
    /// and must not call other [`DmaSpace`] methods.
    ///
    /// Fails without calling `f` when some byte is not mapped, not mapped
    /// for this direction (`write`), or reachable only through the client.
    pub fn with_host_slices<R>(
        &self,
        ranges: &[(u64, u64)],
        write: bool,
        f: impl FnOnce(&[HostSlice]) -> R,
    ) -> Result<R, DmaError> {
        let table = self.read_table();
        let mut slices = Vec::with_capacity(ranges.len());
        for &(iova, len) in ranges {
            let end = iova.checked_add(len).ok_or(DmaError::Overflow {
                iova,
                len: usize::try_from(len).unwrap_or(usize::MAX),
            })?;
            let mut addr = iova;
            while addr < end {
                let (start, m) =
                    mapping_at(&table, addr).ok_or(DmaError::NotMapped { iova: addr })?;
                if !m.allows(write) {
                    return Err(DmaError::Permission { iova: addr, write });
                }
                let Backing::Mapped(region) = &m.backing else {
                    return Err(DmaError::NoHostAddress { iova: addr });
                };
                let n = m.end(start).min(end) - addr;
                // Inside a mapping whose size fits usize (checked at map
                // time), so `off + n` is within the region.
                let (off, n) = ((addr - start) as usize, n as usize);
                slices.push(HostSlice {
                    ptr: region.as_ptr().wrapping_add(off),
                    len: n,
                    mapping: m.id,
                });
                addr += n as u64;
            }
        }
        Ok(f(&slices))
    }

    /// Number of mappings.
    pub fn len(&self) -> usize {
        self.read_table().len()
    }

    /// Whether there is no mapping.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads client memory at `iova` into `buf`. The access may span
    /// adjacent mappings; it fails at the first byte that is not mapped
    /// readable, and then `buf` may be partly filled.
    pub fn read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.access(iova, buf.len(), false, |range, chunk| match chunk {
            Chunk::Local(s) => {
                s.copy_to(&mut buf[range]);
                Ok(())
            }
            Chunk::Remote(c, addr) => read_via_client(c, addr, &mut buf[range]),
        })
    }

    /// Writes `buf` to client memory at `iova`, with the same rules as [`DmaSpace::read`].
    pub fn write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.access(iova, buf.len(), true, |range, chunk| match chunk {
            Chunk::Local(s) => {
                s.copy_from(&buf[range]);
                Ok(())
            }
            Chunk::Remote(c, addr) => write_via_client(c, addr, &buf[range]),
        })
    }

    /// Walks the mappings covering `[iova, iova + len)` and calls `f` for
    /// each piece. Pieces of fd-backed mappings are handed over while the
    /// table is read-locked; client-backed pieces without the lock, because
    /// the client's reply arrives through the same connection that also
    /// delivers DMA_UNMAP.
    fn access<F>(&self, iova: u64, len: usize, write: bool, mut f: F) -> Result<(), DmaError>
    where
        F: FnMut(Range<usize>, Chunk<'_>) -> Result<(), DmaError>,
    {
        iova.checked_add(len as u64)
            .ok_or(DmaError::Overflow { iova, len })?;
        let mut done = 0usize;
        while done < len {
            let addr = iova + done as u64;
            let (range, client) = {
                let table = self.read_table();
                let (start, m) =
                    mapping_at(&table, addr).ok_or(DmaError::NotMapped { iova: addr })?;
                if !m.allows(write) {
                    return Err(DmaError::Permission { iova: addr, write });
                }
                let avail = m.end(start) - addr;
                let n = (len - done).min(usize::try_from(avail).unwrap_or(usize::MAX));
                let range = done..done + n;
                match &m.backing {
                    Backing::Mapped(region) => {
                        // Inside a mapping whose size fits usize (checked at map time).
                        let slice = region
                            .get_slice((addr - start) as usize, n)
                            .map_err(|_| DmaError::NotMapped { iova: addr })?;
                        f(range.clone(), Chunk::Local(slice))?;
                        (range, None)
                    }
                    Backing::Client(c) => (range, Some(c.clone())),
                }
            };
            if let Some(c) = client {
                f(range.clone(), Chunk::Remote(&*c, addr))?;
            }
            done = range.end;
        }
        Ok(())
    }
}

/// A consistent view of the map table for structured access through
/// `vm-memory`'s [`GuestMemory`] (e.g. by `virtio-queue`), with the same
/// bounds and permission checks as [`DmaSpace::read`]. Only fd-backed
/// mappings can be seen through a view.
///
/// The view holds the table's read lock: DMA_MAP and DMA_UNMAP wait until
/// it is dropped, so keep it short-lived, and do not call
/// [`DmaSpace::read`] / [`DmaSpace::write`] while holding one.
pub struct DmaView<'a> {
    table: RwLockReadGuard<'a, BTreeMap<u64, Mapping>>,
}

impl DmaSpace {
    /// Takes a view of the current mappings.
    pub fn view(&self) -> DmaView<'_> {
        DmaView {
            table: self.read_table(),
        }
    }
}

impl DmaView<'_> {
    /// The slice of an fd-backed mapping at `addr`, at most `len` bytes, if
    /// `access` is permitted.
    fn slice_at(
        &self,
        addr: u64,
        len: usize,
        access: Permissions,
    ) -> Result<VolatileSlice<'_>, GuestMemoryError> {
        let bad = || GuestMemoryError::InvalidGuestAddress(GuestAddress(addr));
        let (start, m) = mapping_at(&self.table, addr).ok_or_else(bad)?;
        let allowed = match access {
            Permissions::No => true,
            Permissions::Read => m.readable,
            Permissions::Write => m.writable,
            Permissions::ReadWrite => m.readable && m.writable,
        };
        let Backing::Mapped(region) = &m.backing else {
            return Err(GuestMemoryError::HostAddressNotAvailable);
        };
        if !allowed {
            return Err(bad());
        }
        let avail = usize::try_from(m.end(start) - addr).unwrap_or(usize::MAX);
        region
            .get_slice((addr - start) as usize, len.min(avail))
            .map_err(GuestMemoryError::from)
    }
}

/// Iterates over the slices of an access through a [`DmaView`].
pub struct DmaSliceIter<'a> {
    view: &'a DmaView<'a>,
    addr: u64,
    remaining: usize,
    access: Permissions,
    done: bool,
}

impl<'a> Iterator for DmaSliceIter<'a> {
    type Item = Result<VolatileSlice<'a>, GuestMemoryError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || self.remaining == 0 {
            return None;
        }
        match self.view.slice_at(self.addr, self.remaining, self.access) {
            Ok(slice) => {
                let n = slice.len();
                self.remaining -= n;
                self.addr = self.addr.wrapping_add(n as u64);
                Some(Ok(slice))
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl std::iter::FusedIterator for DmaSliceIter<'_> {}

impl<'a> GuestMemorySliceIterator<'a, ()> for DmaSliceIter<'a> {}

impl GuestMemory for DmaView<'_> {
    type PhysicalMemory = GuestMemoryMmap;
    type Bitmap = ();

    fn check_range(&self, addr: GuestAddress, count: usize, access: Permissions) -> bool {
        match self.get_slices(addr, count, access) {
            Ok(mut it) => it.all(|s| s.is_ok()),
            Err(_) => false,
        }
    }

    fn get_slices<'a>(
        &'a self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> vm_memory::guest_memory::Result<impl GuestMemorySliceIterator<'a, BS<'a, ()>>> {
        if addr.0.checked_add(count as u64).is_none() {
            return Err(GuestMemoryError::GuestAddressOverflow);
        }
        Ok(DmaSliceIter {
            view: self,
            addr: addr.0,
            remaining: count,
            access,
            done: false,
        })
    }
}

/// A piece of an access, as [`DmaSpace::access`] hands it out.
enum Chunk<'a> {
    Local(VolatileSlice<'a>),
    Remote(&'a dyn ClientDma, u64),
}

fn read_via_client(c: &dyn ClientDma, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
    let step = c.max_transfer().max(1);
    for (i, part) in buf.chunks_mut(step).enumerate() {
        c.dma_read(iova + (i * step) as u64, part)?;
    }
    Ok(())
}

fn write_via_client(c: &dyn ClientDma, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
    let step = c.max_transfer().max(1);
    for (i, part) in buf.chunks(step).enumerate() {
        c.dma_write(iova + (i * step) as u64, part)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::sync::Mutex;
    use vmm_sys_util::tempfile::TempFile;

    /// Client memory kept in a Vec, standing in for DMA_READ/WRITE.
    struct VecClient {
        base: u64,
        mem: Mutex<Vec<u8>>,
    }

    impl ClientDma for VecClient {
        fn dma_read(&self, iova: u64, buf: &mut [u8]) -> Result<(), DmaError> {
            let mem = self.mem.lock().unwrap();
            let off = (iova - self.base) as usize;
            buf.copy_from_slice(&mem[off..off + buf.len()]);
            Ok(())
        }
        fn dma_write(&self, iova: u64, buf: &[u8]) -> Result<(), DmaError> {
            let mut mem = self.mem.lock().unwrap();
            let off = (iova - self.base) as usize;
            mem[off..off + buf.len()].copy_from_slice(buf);
            Ok(())
        }
        fn max_transfer(&self) -> usize {
            100
        }
    }

    fn nobody() -> Arc<dyn ClientDma> {
        Arc::new(VecClient {
            base: 0,
            mem: Mutex::new(Vec::new()),
        })
    }

    fn req(iova: u64, size: u64) -> MapRequest {
        MapRequest {
            iova,
            size,
            readable: true,
            writable: true,
            offset: 0,
        }
    }

    fn file_of(size: usize) -> File {
        let f = TempFile::new().unwrap().into_file();
        f.set_len(size as u64).unwrap();
        f
    }

    /// A read-write page at `iova`, backed by a fresh file.
    fn map_page(dma: &DmaSpace, iova: u64) -> Mapped {
        let m = dma.map(&req(iova, 0x1000), Some(file_of(0x1000)), nobody());
        m.unwrap().unwrap()
    }

    /// Pages 0x1000 and 0x2000 read-write and 0x3000 read-only, backed by
    /// files, and 0x4000 the client's: the first two's descriptions.
    fn mixed_pages(dma: &DmaSpace) -> (Mapped, Mapped) {
        let (a, b) = (map_page(dma, 0x1000), map_page(dma, 0x2000));
        let mut ro = req(0x3000, 0x1000);
        ro.writable = false;
        dma.map(&ro, Some(file_of(0x1000)), nobody()).unwrap();
        dma.map(&req(0x4000, 0x1000), None, nobody()).unwrap();
        (a, b)
    }

    #[test]
    fn test_map_rejects_bad_ranges() {
        let dma = DmaSpace::new();
        for (iova, size) in [(0, 0), (1, 4096), (0, 100), (u64::MAX - 4095, 8192)] {
            assert!(matches!(
                dma.map(&req(iova, size), None, nobody()),
                Err(MapError::Invalid(_))
            ));
        }
        let mut r = req(0, 4096);
        r.readable = false;
        r.writable = false;
        assert!(matches!(
            dma.map(&r, None, nobody()),
            Err(MapError::Invalid(_))
        ));
        assert!(dma.is_empty());
    }

    #[test]
    fn test_map_overlap_is_eexist() {
        let dma = DmaSpace::new();
        dma.map(&req(0x10000, 0x4000), None, nobody()).unwrap();
        for (iova, size) in [
            (0x10000, 0x1000),
            (0xf000, 0x2000),
            (0x13000, 0x1000),
            (0, 0x100000),
        ] {
            let e = dma.map(&req(iova, size), None, nobody()).unwrap_err();
            assert_eq!(e.errno(), libc::EEXIST as u32);
        }
        dma.map(&req(0xf000, 0x1000), None, nobody()).unwrap();
        dma.map(&req(0x14000, 0x1000), None, nobody()).unwrap();
        assert_eq!(dma.len(), 3);
    }

    #[test]
    fn test_map_limit() {
        let dma = DmaSpace::new();
        dma.set_max_maps(2);
        dma.map(&req(0, 4096), None, nobody()).unwrap();
        dma.map(&req(4096, 4096), None, nobody()).unwrap();
        let e = dma.map(&req(8192, 4096), None, nobody()).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC as u32);
    }

    #[test]
    fn test_unmap_like_type1() {
        let dma = DmaSpace::new();
        dma.map(&req(0x1000, 0x1000), None, nobody()).unwrap();
        dma.map(&req(0x3000, 0x2000), None, nobody()).unwrap();
        // Nothing inside: success, nothing removed.
        assert!(dma.unmap(0x100000, 0x1000).unwrap().is_empty());
        // Straddling an edge: refused, nothing removed.
        assert!(matches!(
            dma.unmap(0x4000, 0x1000),
            Err(MapError::Split(0x3000))
        ));
        assert!(matches!(
            dma.unmap(0x2000, 0x2000),
            Err(MapError::Split(0x3000))
        ));
        assert_eq!(dma.len(), 2);
        // A large range removes everything inside.
        let removed = dma.unmap(0, 1 << 40).unwrap();
        let ranges: Vec<(u64, u64)> = removed.ranges().iter().map(|u| (u.iova, u.size)).collect();
        assert_eq!(ranges, vec![(0x1000, 0x1000), (0x3000, 0x2000)]);
        // Each mapping has its own id.
        assert_ne!(removed.ranges()[0].id, removed.ranges()[1].id);
        assert!(dma.is_empty());
        assert!(matches!(dma.unmap(0, 0), Err(MapError::Invalid(_))));
        assert!(matches!(dma.unmap(u64::MAX, 2), Err(MapError::Invalid(_))));
        // Up to exactly 2^64, as QEMU sends when a guest IOMMU goes away.
        dma.map(&req(0xfef0_0000, 0x1000), None, nobody()).unwrap();
        let removed = dma
            .unmap(0xfef0_0000, 0u64.wrapping_sub(0xfef0_0000))
            .unwrap();
        assert_eq!(removed.ranges().len(), 1);
        assert!(dma.unmap(u64::MAX, 1).unwrap().is_empty());
    }

    #[test]
    fn test_fd_backed_read_write_and_bounds() {
        let dma = DmaSpace::new();
        let mut f = file_of(0x3000);
        f.write_all(b"hello").unwrap();
        let mut r = req(0x10000, 0x2000);
        r.offset = 0;
        dma.map(&r, Some(f.try_clone().unwrap()), nobody()).unwrap();
        let mut buf = [0u8; 5];
        dma.read(0x10000, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        dma.write(0x11ffc, b"abcd").unwrap();
        // Past the end of the mapping: a fault, not a host access.
        assert_eq!(
            dma.write(0x11ffe, b"abcd"),
            Err(DmaError::NotMapped { iova: 0x12000 })
        );
        assert_eq!(
            dma.read(0xfff0, &mut buf),
            Err(DmaError::NotMapped { iova: 0xfff0 })
        );
        assert!(matches!(
            dma.read(u64::MAX - 1, &mut buf),
            Err(DmaError::Overflow { .. })
        ));
    }

    #[test]
    fn test_permissions_enforced() {
        let dma = DmaSpace::new();
        let mut r = req(0, 0x1000);
        r.writable = false;
        dma.map(&r, Some(file_of(0x1000)), nobody()).unwrap();
        let mut buf = [0u8; 4];
        dma.read(0, &mut buf).unwrap();
        assert_eq!(
            dma.write(0, &buf),
            Err(DmaError::Permission {
                iova: 0,
                write: true
            })
        );
        let mut r = req(0x1000, 0x1000);
        r.readable = false;
        dma.map(&r, None, nobody()).unwrap();
        assert_eq!(
            dma.read(0x1000, &mut buf),
            Err(DmaError::Permission {
                iova: 0x1000,
                write: false
            })
        );
    }

    #[test]
    fn test_access_spans_fd_and_client_mappings() {
        let dma = DmaSpace::new();
        let client = Arc::new(VecClient {
            base: 0x1000,
            mem: Mutex::new(vec![7u8; 0x1000]),
        });
        map_page(&dma, 0);
        dma.map(&req(0x1000, 0x1000), None, client.clone()).unwrap();
        let data: Vec<u8> = (0..0x400u32).map(|i| i as u8).collect();
        dma.write(0xe00, &data).unwrap();
        let mut back = vec![0u8; data.len()];
        dma.read(0xe00, &mut back).unwrap();
        assert_eq!(back, data);
        assert_eq!(client.mem.lock().unwrap()[0x1ff], data[0x3ff]);
    }

    #[test]
    fn test_view_enforces_bounds_and_permissions() {
        use vm_memory::Bytes;
        let dma = DmaSpace::new();
        mixed_pages(&dma);
        let view = dma.view();
        // Spanning two adjacent mappings works.
        view.write_obj(0x1234_5678_u64, GuestAddress(0x1ffc))
            .unwrap();
        assert_eq!(
            view.read_obj::<u64>(GuestAddress(0x1ffc)).unwrap(),
            0x1234_5678
        );
        assert!(view.check_range(GuestAddress(0x1000), 0x2000, Permissions::ReadWrite));
        assert!(!view.check_range(GuestAddress(0x1000), 0x2001, Permissions::ReadWrite));
        assert!(view.check_range(GuestAddress(0x3000), 8, Permissions::Read));
        assert!(!view.check_range(GuestAddress(0x3000), 8, Permissions::Write));
        assert!(view.write_obj(1u32, GuestAddress(0x3000)).is_err());
        // Client-backed memory is not reachable through a view.
        assert!(!view.check_range(GuestAddress(0x4000), 8, Permissions::Read));
        assert!(!view.check_range(GuestAddress(u64::MAX - 3), 8, Permissions::Read));
    }

    #[test]
    fn test_duplicate_fds_of_one_file_are_not_kept_open() {
        let dma = DmaSpace::new();
        let file = file_of(0x10000);
        let before = std::fs::read_dir("/proc/self/fd").unwrap().count();
        for i in 0..16u64 {
            let mut r = req(i * 0x1000, 0x1000);
            r.offset = i * 0x1000;
            dma.map(&r, Some(file.try_clone().unwrap()), nobody())
                .unwrap();
        }
        let after = std::fs::read_dir("/proc/self/fd").unwrap().count();
        // At most one extra fd for all sixteen mappings (other tests run
        // in parallel threads, so allow a little slack).
        assert!(after <= before + 4, "{before} -> {after}");
        let mut buf = [0u8; 4];
        dma.write(0x3000, b"abcd").unwrap();
        dma.read(0x3000, &mut buf).unwrap();
        assert_eq!(&buf, b"abcd");
    }

    #[test]
    fn test_map_past_end_of_fd_is_refused() {
        let dma = DmaSpace::new();
        let e = dma
            .map(&req(0, 0x2000), Some(file_of(0x1000)), nobody())
            .unwrap_err();
        assert!(matches!(e, MapError::Invalid(_)));
        let mut r = req(0, 0x1000);
        r.offset = 0x1000;
        assert!(dma.map(&r, Some(file_of(0x1000)), nobody()).is_err());
        let (rx, _tx) = std::os::unix::net::UnixStream::pair().unwrap();
        let sock = File::from(std::os::fd::OwnedFd::from(rx));
        assert!(dma.map(&req(0, 0x1000), Some(sock), nobody()).is_err());
        assert!(dma.is_empty());
    }

    #[test]
    fn test_mmap_failure_is_reported() {
        let dma = DmaSpace::new();
        // A read-only fd cannot back a writable shared mapping.
        let path = TempFile::new().unwrap();
        path.as_file().set_len(4096).unwrap();
        let ro = File::open(path.as_path()).unwrap();
        let e = dma.map(&req(0, 4096), Some(ro), nobody()).unwrap_err();
        assert!(matches!(e, MapError::Mmap(_)));
        assert!(dma.is_empty());
    }

    /// Whether `addr` lies in a mapping of this process.
    fn ino(m: &Mapped) -> u64 {
        use std::os::unix::fs::MetadataExt;
        m.file.metadata().unwrap().ino()
    }

    /// Whether `addr` is mapped from the file with inode `ino`: other
    /// tests running meanwhile may map something else at a freed address.
    fn maps_file(addr: usize, ino: u64) -> bool {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (a, b) = f.next()?.split_once('-')?;
                let inode = f.nth(3)?.parse::<u64>().ok()?;
                Some((a, b, inode))
            })
            .any(|(a, b, inode)| {
                let a = usize::from_str_radix(a, 16).unwrap();
                let b = usize::from_str_radix(b, 16).unwrap();
                inode == ino && (a..b).contains(&addr)
            })
    }

    #[test]
    fn test_map_describes_fd_backed_mappings_only() {
        let dma = DmaSpace::new();
        let mut f = file_of(0x4000);
        f.write_all(&[0u8; 0x2000]).unwrap();
        f.write_all(b"page two").unwrap();
        let mut r = req(0x10000, 0x2000);
        r.offset = 0x2000;
        r.writable = false;
        let m = dma.map(&r, Some(f), nobody()).unwrap().unwrap();
        assert_eq!((m.iova, m.size, m.file_offset), (0x10000, 0x2000, 0x2000));
        assert!(m.readable && !m.writable);
        // The host address is the mapping of that file offset.
        // SAFETY: the mapping is 0x2000 readable bytes and stays mapped
        // while `dma` holds it.
        let seen = unsafe { std::slice::from_raw_parts(m.host_addr as *const u8, 8) };
        assert_eq!(seen, b"page two");
        assert_eq!(m.file.metadata().unwrap().len(), 0x4000);
        // Without an fd there is nothing to describe.
        assert!(dma
            .map(&req(0x20000, 0x1000), None, nobody())
            .unwrap()
            .is_none());
        assert_ne!(m.id, map_page(&dma, 0x30000).id);
    }

    #[test]
    fn test_removed_memory_stays_mapped_until_dropped() {
        let dma = DmaSpace::new();
        let m = map_page(&dma, 0x10000);
        assert!(maps_file(m.host_addr, ino(&m)));
        let removed = dma.unmap(0x10000, 0x1000).unwrap();
        assert_eq!(removed.ranges()[0].id, m.id);
        // Out of the table, but still mapped for the model to release.
        assert!(dma.is_empty());
        assert!(maps_file(m.host_addr, ino(&m)));
        drop(removed);
        assert!(!maps_file(m.host_addr, ino(&m)));

        let m = map_page(&dma, 0x10000);
        let all = dma.unmap_all();
        assert!(maps_file(m.host_addr, ino(&m)));
        drop(all);
        assert!(!maps_file(m.host_addr, ino(&m)));
    }

    #[test]
    fn test_host_slices_checked_like_accesses() {
        let dma = DmaSpace::new();
        let (a, b) = mixed_pages(&dma);

        // One range across two mappings, and a second range: three slices.
        let got = dma
            .with_host_slices(&[(0x1f00, 0x200), (0x1010, 0x10)], true, |s| s.to_vec())
            .unwrap();
        assert_eq!(
            got,
            vec![
                HostSlice {
                    ptr: (a.host_addr + 0xf00) as *mut u8,
                    len: 0x100,
                    mapping: a.id
                },
                HostSlice {
                    ptr: b.host_addr as *mut u8,
                    len: 0x100,
                    mapping: b.id
                },
                HostSlice {
                    ptr: (a.host_addr + 0x10) as *mut u8,
                    len: 0x10,
                    mapping: a.id
                },
            ]
        );
        let mut called = false;
        let mut attempt =
            |ranges: &[(u64, u64)], write| dma.with_host_slices(ranges, write, |_| called = true);
        assert_eq!(
            attempt(&[(0x3000, 8)], true),
            Err(DmaError::Permission {
                iova: 0x3000,
                write: true
            })
        );
        assert_eq!(attempt(&[(0x3000, 8)], false), Ok(()));
        assert_eq!(
            attempt(&[(0x3ff0, 0x20)], false),
            Err(DmaError::NoHostAddress { iova: 0x4000 })
        );
        assert_eq!(
            attempt(&[(0x1000, 8), (0x5000, 8)], false),
            Err(DmaError::NotMapped { iova: 0x5000 })
        );
        assert!(matches!(
            attempt(&[(u64::MAX - 1, 8)], false),
            Err(DmaError::Overflow { .. })
        ));
        assert!(called, "f runs once, for the permitted read");
    }
}
