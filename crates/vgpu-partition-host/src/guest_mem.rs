//! The host's side of forwarded guest memory: the memory control thread
//! maps what the daemon announces and tells the inner partition's
//! registry; transfers name pieces of those mappings, which are checked
//! against the table here before the inner backend sees a pointer.
//!
//! # Concurrency
//!
//! The table is a read-write lock. A transfer holds the read lock from
//! resolving its pieces until the inner backend returns, so an `Unmap`
//! (which takes the write lock) waits for any transfer using the mapping
//! and no transfer starts on a mapping being removed. The inner registry
//! is called by the control thread without the partition, as in process.
//! The write lock never waits for the daemon: the daemon answers an
//! `Unmap` only after the device model stopped using the mapping, and a
//! transfer in progress here needs nothing from the daemon to finish.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use log::debug;
use vgpu_backend::{HostMapping, HostMemory, HostSlice, OpError};
use vgpu_sys::mmap::{page_size, SharedMapping};
use vgpu_sys::warn_limited;

use crate::proto::{MappedPiece, Reply, Request, Value, MAX_CONTROL};
use crate::wire::{self, WireError};

/// Most mappings a host keeps at once (a VMM maps guest RAM in a few
/// regions; the bound keeps a misbehaving daemon from exhausting us).
pub(crate) const MAX_MAPPINGS: usize = 4096;

/// One mapping of guest memory in this process.
pub(crate) struct Region {
    /// The mmap'ed range (page aligned); unmapped when dropped.
    map: SharedMapping,
    /// Where the mapping's first byte is in `map`.
    delta: usize,
    len: usize,
    readable: bool,
    writable: bool,
}

impl Region {
    /// The mapping's first byte.
    fn base(&self) -> *mut u8 {
        self.map.as_ptr().wrapping_add(self.delta)
    }
}

/// The table, write-locked, counted in `Table::writers` while it lives.
struct WriteGuard<'a> {
    maps: RwLockWriteGuard<'a, HashMap<u64, Region>>,
    writers: &'a AtomicUsize,
}

impl Drop for WriteGuard<'_> {
    fn drop(&mut self) {
        self.writers.fetch_sub(1, Ordering::AcqRel);
    }
}

impl std::ops::Deref for WriteGuard<'_> {
    type Target = HashMap<u64, Region>;
    fn deref(&self) -> &Self::Target {
        &self.maps
    }
}

impl std::ops::DerefMut for WriteGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.maps
    }
}

/// The table, read-locked: its mappings stay in place while this lives.
pub(crate) type Pinned<'a> = RwLockReadGuard<'a, HashMap<u64, Region>>;

/// The host's forwarded mappings, by the daemon's ids.
#[derive(Default)]
pub(crate) struct Table {
    maps: RwLock<HashMap<u64, Region>>,
    /// Threads waiting for (or holding) the write lock: a reader that
    /// keeps the lock across runs lets go when it sees one.
    writers: AtomicUsize,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("mappings", &self.read().len())
            .finish()
    }
}

impl Table {
    fn read(&self) -> RwLockReadGuard<'_, HashMap<u64, Region>> {
        vgpu_sys::sync::read(&self.maps)
    }

    /// The table, read-locked: every mapping stays until this is dropped.
    pub(crate) fn pin(&self) -> Pinned<'_> {
        self.read()
    }

    /// Whether a map or unmap waits for the readers.
    pub(crate) fn writer_waiting(&self) -> bool {
        self.writers.load(Ordering::Acquire) > 0
    }

    fn write(&self) -> WriteGuard<'_> {
        self.writers.fetch_add(1, Ordering::AcqRel);
        WriteGuard {
            maps: vgpu_sys::sync::write(&self.maps),
            writers: &self.writers,
        }
    }

    /// Maps `len` bytes of `file` from `file_offset`, shared, with the
    /// protection given; the file must hold them.
    pub(crate) fn map(
        &self,
        id: u64,
        file: &Arc<File>,
        file_offset: u64,
        len: u64,
        readable: bool,
        writable: bool,
    ) -> Result<(usize, usize), OpError> {
        let size = file
            .metadata()
            .map_err(|e| OpError::Device(format!("guest memory file: {e}")))?
            .len();
        if len == 0 || file_offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(OpError::Invalid(format!(
                "{len} bytes at {file_offset} of a {size}-byte file"
            )));
        }
        if !readable && !writable {
            return Err(OpError::Invalid("a mapping with no access".into()));
        }
        let delta = file_offset % page_size();
        let map_len = usize::try_from(len + delta)
            .map_err(|_| OpError::Invalid("mapping too large".into()))?;
        let off = libc::off_t::try_from(file_offset - delta)
            .map_err(|_| OpError::Invalid("offset too large".into()))?;
        let mut maps = self.write();
        if maps.contains_key(&id) {
            return Err(OpError::Invalid(format!("mapping {id} exists already")));
        }
        if maps.len() >= MAX_MAPPINGS {
            return Err(OpError::NoMemory {
                requested: len,
                available: 0,
            });
        }
        let prot = (if readable { libc::PROT_READ } else { 0 })
            | (if writable { libc::PROT_WRITE } else { 0 });
        // A range the file holds (checked above).
        let map = vgpu_sys::mmap::map_shared(Arc::clone(file), off as u64, map_len, prot)
            .map_err(|e| OpError::Device(format!("cannot map guest memory: {e}")))?;
        let region = Region {
            map,
            delta: delta as usize,
            len: map_len - delta as usize,
            readable,
            writable,
        };
        let base = region.base();
        maps.insert(id, region);
        Ok((base as usize, map_len - delta as usize))
    }

    /// Takes a mapping out of the table, once no transfer uses it.
    pub(crate) fn remove(&self, id: u64) -> Option<Region> {
        self.write().remove(&id)
    }

    /// Checks every piece against the table and returns the slices, with
    /// the read lock that keeps them mapped. `write`: the device writes
    /// them (a download).
    pub(crate) fn resolve(
        &self,
        pieces: &[MappedPiece],
        write: bool,
    ) -> Result<(Pinned<'_>, Vec<HostSlice>, u64), OpError> {
        let maps = self.read();
        let (slices, total) = Self::resolve_in(&maps, pieces, write)?;
        Ok((maps, slices, total))
    }

    /// [`Table::resolve`] against a table the caller has pinned.
    pub(crate) fn resolve_in(
        maps: &Pinned<'_>,
        pieces: &[MappedPiece],
        write: bool,
    ) -> Result<(Vec<HostSlice>, u64), OpError> {
        let mut slices = Vec::with_capacity(pieces.len());
        let mut total = 0u64;
        for p in pieces {
            let r = maps.get(&p.mapping).ok_or_else(|| {
                OpError::Invalid(format!("piece in unknown mapping {}", p.mapping))
            })?;
            if (write && !r.writable) || (!write && !r.readable) {
                return Err(OpError::Invalid(format!(
                    "mapping {} does not allow this access",
                    p.mapping
                )));
            }
            if p.len == 0 || p.offset.checked_add(p.len).is_none_or(|e| e > r.len as u64) {
                return Err(OpError::Invalid(format!(
                    "piece of {} bytes at {} outside mapping {} of {} bytes",
                    p.len, p.offset, p.mapping, r.len
                )));
            }
            total = total
                .checked_add(p.len)
                .ok_or_else(|| OpError::Invalid("pieces too long".into()))?;
            slices.push(HostSlice {
                // SAFETY: offset + len lies inside the region (checked).
                ptr: unsafe { r.base().add(p.offset as usize) },
                len: p.len as usize,
                mapping: p.mapping,
            });
        }
        Ok((slices, total))
    }
}

/// Serves the memory control socket until the daemon closes it: maps and
/// unmaps guest memory, telling `inner` (the inner partition's registry).
pub(crate) fn serve_control(
    mut stream: UnixStream,
    table: Arc<Table>,
    inner: Option<Arc<dyn HostMemory>>,
) -> Result<(), WireError> {
    let mut buf = Vec::new();
    loop {
        let (h, fd) = match wire::recv(&mut stream, MAX_CONTROL, &mut buf, true) {
            Ok(x) => x,
            Err(WireError::Closed) => return Ok(()),
            Err(e) => return Err(e),
        };
        let req = Request::decode(h.kind, &buf)?;
        let kind = req.kind();
        let result = match (req, fd) {
            (Request::Map(m), Some(file)) => {
                let file = Arc::new(file);
                table
                    .map(m.id, &file, m.file_offset, m.len, m.readable, m.writable)
                    .map(|(addr, len)| {
                        debug!("partition host: guest memory {} mapped, {len} bytes", m.id);
                        if let Some(hm) = &inner {
                            hm.mapped(HostMapping {
                                id: m.id,
                                addr,
                                len,
                                readable: m.readable,
                                writable: m.writable,
                                file,
                                file_offset: m.file_offset,
                            });
                        }
                        Value::None
                    })
            }
            (Request::Unmap { id }, None) => match table.remove(id) {
                Some(region) => {
                    // The inner partition lets go first, then the memory.
                    if let Some(hm) = &inner {
                        hm.unmapped(id);
                    }
                    drop(region);
                    Ok(Value::None)
                }
                None => Err(OpError::NotFound(format!("mapping {id}"))),
            },
            _ => {
                warn_limited!("partition host: unexpected frame {kind:?} on the memory socket");
                return Err(crate::proto::ProtoError::Kind(h.kind).into());
            }
        };
        let reply = Reply {
            memory_used: 0,
            result,
        };
        wire::send_reply(&stream, kind, h.seq, &reply)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn memfd(len: u64) -> Arc<File> {
        Arc::new(vgpu_sys::memfd::create(c"t", len).unwrap())
    }

    #[test]
    fn test_pieces_are_checked_against_the_table() {
        let t = Table::default();
        let f = memfd(3 * 4096);
        assert!(
            t.map(1, &f, 4096, 3 * 4096, true, true).is_err(),
            "past the end"
        );
        assert!(t.map(1, &f, u64::MAX, 2, true, true).is_err(), "overflow");
        assert!(t.map(1, &f, 0, 0, true, true).is_err(), "empty");
        assert!(t.map(1, &f, 0, 4096, false, false).is_err(), "no access");
        t.map(1, &f, 100, 8000, true, false).unwrap();
        assert!(t.map(1, &f, 0, 4096, true, false).is_err(), "same id");
        let p = |mapping, offset, len| MappedPiece {
            mapping,
            offset,
            len,
        };
        let (guard, s, n) = t.resolve(&[p(1, 0, 10), p(1, 7990, 10)], false).unwrap();
        assert_eq!((s.len(), n), (2, 20));
        drop(guard);
        for bad in [
            vec![p(2, 0, 1)],
            vec![p(1, 7991, 10)],
            vec![p(1, u64::MAX, 2)],
            vec![p(1, 0, 0)],
        ] {
            assert!(t.resolve(&bad, false).is_err(), "{bad:?}");
        }
        assert!(t.resolve(&[p(1, 0, 1)], true).is_err(), "read-only");
        // Bytes go where the offset says (the file offset was not page
        // aligned).
        use std::os::unix::fs::FileExt;
        f.write_all_at(b"hello", 100 + 7990).unwrap();
        let (guard, slices, len) = t.resolve(&[p(1, 7990, 5)], false).unwrap();
        // SAFETY: resolved under `guard`, which lives until after the reads.
        let src = unsafe { vgpu_backend::SliceMemory::new(&slices) };
        use vgpu_backend::HostSource;
        assert_eq!(HostSource::len(&src), len);
        let mut b = [0u8; 5];
        src.read_at(0, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(src.read_at(1, &mut b).is_err());
        drop(guard);
        assert!(t.remove(1).is_some());
        assert!(t.remove(1).is_none());
    }
}
