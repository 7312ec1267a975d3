//! Device work as the driver queues it: launches, fills, writes, copies,
//! host functions and event records and waits; what a stream queues, a
//! capture records and a graph replays.

use std::sync::Arc;

use vgpu_guest::{Batch, Dims, Function};

use crate::cu::CuResult;
use crate::diag::check;
use crate::inflight::FLUSH_AT;

/// Device work as queued: what a capture records and a graph replays.
#[derive(Clone)]
pub enum Work {
    /// A kernel launch.
    Launch {
        /// The `CUfunction` it launches (what a node's parameters name).
        func: usize,
        /// The device's description and handle of the function.
        function: Arc<Function>,
        /// Grid, block and dynamic shared memory.
        dims: Dims,
        /// Blocks per cluster in x, y and z (`[1, 1, 1]`: none).
        cluster: [u32; 3],
        /// A cooperative launch: every block resident at once.
        cooperative: bool,
        /// The parameter block, packed as the function's layout says.
        params: Arc<[u8]>,
    },
    /// A fill of device memory with a 32-bit pattern.
    Fill {
        /// The first byte filled.
        addr: u64,
        /// Bytes filled, a multiple of 4.
        len: u64,
        /// The pattern, repeated.
        pattern: u32,
    },
    /// Bytes written to the device (the 1 to 3 bytes after a memset's
    /// whole words).
    Write {
        /// The first byte written.
        addr: u64,
        /// The bytes.
        bytes: Arc<[u8]>,
    },
    /// A copy within one device's memory.
    Copy {
        /// Destination address.
        dst: u64,
        /// Source address.
        src: u64,
        /// Bytes copied.
        len: u64,
    },
    /// A host function (`cuLaunchHostFunc` in a capture, a host node):
    /// called once the work before it is done, before the work after it.
    Host(HostCall),
    /// A copy from page-locked host memory of the process to the device
    /// (an asynchronous copy captured, a memcpy node).
    Upload {
        /// Destination device address.
        dst: u64,
        /// Source host address.
        src: u64,
        /// Bytes copied.
        len: u64,
    },
    /// A copy from the device to page-locked host memory.
    Download {
        /// Destination host address.
        dst: u64,
        /// Source device address.
        src: u64,
        /// Bytes copied.
        len: u64,
    },
    /// A copy from pageable host memory to the device (a memcpy node or
    /// a captured copy): made between batches, once the work before it
    /// is done, as a synchronous copy is.
    PageableUpload {
        /// Destination device address.
        dst: u64,
        /// Source host address.
        src: u64,
        /// Bytes copied.
        len: u64,
    },
    /// A copy from the device to pageable host memory, made as
    /// [`Work::PageableUpload`] is.
    PageableDownload {
        /// Destination host address.
        dst: u64,
        /// Source device address.
        src: u64,
        /// Bytes copied.
        len: u64,
    },
    /// Records an event (its handle) once the work before it is done (an
    /// event record node).
    Record(usize),
    /// Waits for an event's last record (an event wait node): on one
    /// vGPU everything before it is done already; a record on another
    /// vGPU is waited for before the work after it is queued.
    Wait(usize),
}

/// A host function and its argument.
#[derive(Clone, Copy, Debug)]
pub struct HostCall {
    /// The program's function.
    pub f: unsafe extern "C" fn(*mut std::ffi::c_void),
    /// Its argument, as an address.
    pub user: usize,
}

impl HostCall {
    /// Calls it.
    ///
    /// # Safety
    /// The program's function, called with its own argument, as CUDA
    /// would; the program guarantees both are valid while the graph is.
    pub unsafe fn call(&self) {
        // SAFETY: as above.
        unsafe { (self.f)(self.user as *mut std::ffi::c_void) }
    }
}

impl Work {
    /// Adds the work's commands to `batch`.
    pub fn add_to(&self, batch: &mut Batch) {
        match self {
            Work::Launch {
                function,
                dims,
                cluster,
                cooperative,
                params,
                ..
            } => {
                if *cooperative {
                    batch.launch_function_cooperative(function, *dims, *cluster, params);
                } else {
                    batch.launch_function_in_clusters(function, *dims, *cluster, params);
                }
            }
            Work::Fill { addr, len, pattern } => {
                batch.fill_addr(*addr, *len, *pattern);
            }
            Work::Write { addr, bytes } => {
                batch.copy_to_device_addr(*addr, bytes);
            }
            Work::Copy { dst, src, len } => {
                batch.copy_device_addr(*dst, *src, *len);
            }
            // No device command: the queue runs it between batches.
            Work::Host(_)
            | Work::Record(_)
            | Work::Wait(_)
            | Work::PageableUpload { .. }
            | Work::PageableDownload { .. } => {}
            Work::Upload { dst, src, len } => {
                // SAFETY: the source was page-locked memory of this process
                // when the work was recorded, and a graph launch checks it
                // still is (`cuGraphLaunch`); the program keeps it, as
                // CUDA requires, while the work may run.
                unsafe { batch.copy_user_to_device_addr(*dst, *src as *const u8, *len) };
            }
            Work::Download { dst, src, len } => {
                // SAFETY: as for an upload, for the destination.
                unsafe { batch.copy_device_addr_to_user(*dst as *mut u8, *src, *len) };
            }
        }
    }

    /// The host range of a copy with a host side, if it is one.
    pub fn host_range(&self) -> Option<(u64, u64)> {
        match self {
            Work::Upload { src, len, .. } => Some((*src, *len)),
            Work::Download { dst, len, .. } => Some((*dst, *len)),
            _ => None,
        }
    }

    /// Whether the queue runs it between batches rather than as a
    /// device command.
    pub fn between_batches(&self) -> bool {
        matches!(
            self,
            Work::Host(_)
                | Work::Record(_)
                | Work::Wait(_)
                | Work::PageableUpload { .. }
                | Work::PageableDownload { .. }
        )
    }

    /// The same copy with its host side in pageable memory: an upload or
    /// download made between batches; other work as it is.
    pub fn pageable(self) -> Work {
        match self {
            Work::Upload { dst, src, len } => Work::PageableUpload { dst, src, len },
            Work::Download { dst, src, len } => Work::PageableDownload { dst, src, len },
            w => w,
        }
    }

    /// Refuses work the device would refuse to build (the error queueing
    /// it would return), so a capture fails where the call is, not at a
    /// replay.
    pub fn check(&self) -> CuResult {
        let mut one = Batch::new();
        self.add_to(&mut one);
        check(Batch::new().append(one))
    }
}

/// Hands `work` to `submit` in order, in batches that reach [`FLUSH_AT`]
/// commands at the most by their last item (an item is one command, a
/// copy one per 64 MiB), so one call's work, such as a memset's fill and
/// tail, is one batch, as it always was. Each item is built straight into
/// the batch: this is every launch's path. A batch that fails to build is
/// refused whole by `submit`.
pub fn in_batches(work: &[Work], mut submit: impl FnMut(Batch) -> CuResult) -> CuResult {
    let mut open = Batch::new();
    for w in work {
        if open.len() >= FLUSH_AT {
            submit(std::mem::take(&mut open))?;
        }
        w.add_to(&mut open);
    }
    if open.is_empty() {
        return Ok(());
    }
    submit(open)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_with_pageable_memory_runs_between_batches() {
        let up = Work::Upload {
            dst: 0x1000,
            src: 0x2000,
            len: 8,
        };
        let down = Work::Download {
            dst: 0x2000,
            src: 0x1000,
            len: 8,
        };
        assert!(!up.between_batches() && !down.between_batches());
        let (up, down) = (up.pageable(), down.pageable());
        assert!(matches!(
            up,
            Work::PageableUpload {
                dst: 0x1000,
                src: 0x2000,
                len: 8
            }
        ));
        assert!(matches!(
            down,
            Work::PageableDownload {
                dst: 0x2000,
                src: 0x1000,
                len: 8
            }
        ));
        assert!(up.between_batches() && down.between_batches());
        // No device command, and no page-locked range a launch checks.
        assert_eq!(up.check(), Ok(()));
        assert_eq!(up.host_range(), None);
        // Other work stays as it is.
        let copy = Work::Copy {
            dst: 1,
            src: 2,
            len: 3,
        }
        .pageable();
        assert!(matches!(copy, Work::Copy { .. }));
    }
}
