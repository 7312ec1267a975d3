//! The open device file: its ioctls, and SUBMIT and WAIT of raw
//! commands, under everything that uses the device.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::sys::{self, VgpuCmd, VgpuInfo};

/// An open `/dev/vgpuN`, shared by the [`crate::Device`] and everything
/// that must keep the file open: buffers, modules, pending batches, the
/// window's mapping, lanes.
pub(crate) struct Inner {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) info: VgpuInfo,
    /// A lane's owner, kept open while the lane is (its resources are
    /// the lane's).
    pub(crate) owner: Option<Arc<Inner>>,
}

impl Inner {
    /// Issues ioctl `req` on `arg`.
    ///
    /// # Safety
    ///
    /// `req` must be an ioctl whose argument is a `T` (the driver reads
    /// and writes at most `size_of::<T>()` bytes at `arg`), and every user
    /// pointer inside `*arg` must satisfy that ioctl's contract.
    pub(crate) unsafe fn ioctl<T>(&self, req: u64, arg: &mut T) -> Result<()> {
        // SAFETY: `arg` is a live, exclusively borrowed `T` for the whole
        // call, and the caller guarantees `req` reads/writes a `T` there.
        let rc = unsafe {
            libc::ioctl(
                self.file.as_raw_fd(),
                req as libc::Ioctl,
                arg as *mut T as *mut libc::c_void,
            )
        };
        if rc < 0 {
            Err(Error::last_os_error())
        } else {
            Ok(())
        }
    }

    pub(crate) fn query_info(&self) -> Result<VgpuInfo> {
        let mut info = VgpuInfo::default();
        // SAFETY: IOCTL_INFO writes one `VgpuInfo`; no pointers inside.
        unsafe { self.ioctl(sys::IOCTL_INFO, &mut info) }?;
        Ok(info)
    }

    pub(crate) fn free(&self, addr: u64) -> Result<()> {
        let mut f = sys::VgpuFree { addr };
        // SAFETY: IOCTL_FREE reads one `VgpuFree`; no pointers inside.
        unsafe { self.ioctl(sys::IOCTL_FREE, &mut f) }
    }

    /// SUBMIT without waiting; returns the fence. Retries while a signal
    /// interrupts the wait for ring space (nothing is queued then).
    ///
    /// # Safety
    ///
    /// Every user pointer in `cmds` must stay valid for the device's
    /// accesses (reads of sources, writes of destinations) until the
    /// fence has completed, and `cmds` itself until the fence is collected
    /// if results are written there.
    pub(crate) unsafe fn submit(&self, cmds: &mut [VgpuCmd]) -> Result<u64> {
        let count = u32::try_from(cmds.len())
            .ok()
            .filter(|n| (1..=sys::MAX_BATCH_CMDS).contains(n))
            .ok_or_else(|| {
                Error::Usage(format!(
                    "a batch has 1 to {} commands, not {}",
                    sys::MAX_BATCH_CMDS,
                    cmds.len()
                ))
            })?;
        loop {
            let mut s = sys::VgpuSubmit {
                cmds: cmds.as_mut_ptr() as u64,
                count,
                ..Default::default()
            };
            // SAFETY: IOCTL_SUBMIT takes a `VgpuSubmit`; its `cmds` points
            // at `count` commands, and the caller vouches for the pointers
            // inside them.
            match unsafe { self.ioctl(sys::IOCTL_SUBMIT, &mut s) } {
                Ok(()) => return Ok(s.fence),
                Err(Error::Interrupted) => continue,
                Err(e) => return Err(rejected(e, s.error_index)),
            }
        }
    }

    /// Waits for `fence`; with `cmds`, writes its results there.
    /// `Ok(Some(_))` is the first failure (index, errno).
    pub(crate) fn wait(
        &self,
        fence: u64,
        timeout: Option<Duration>,
        cmds: Option<&mut [VgpuCmd]>,
    ) -> Result<Option<(u32, i32)>> {
        let timeout_ns = match timeout {
            None => sys::TIMEOUT_INFINITE,
            Some(t) => u64::try_from(t.as_nanos())
                .unwrap_or(u64::MAX - 1)
                .min(u64::MAX - 1),
        };
        let (ptr, count) = match cmds {
            Some(c) => (c.as_mut_ptr() as u64, c.len() as u32),
            None => (0, 0),
        };
        let mut w = sys::VgpuWait {
            fence,
            timeout_ns,
            cmds: ptr,
            count,
            ..Default::default()
        };
        // SAFETY: IOCTL_WAIT takes a `VgpuWait`; `cmds` is 0 or points at
        // `count` writable commands borrowed for the call.
        unsafe { self.ioctl(sys::IOCTL_WAIT, &mut w) }?;
        Ok((w.error != 0).then_some((w.error_index, w.error)))
    }

    /// Runs `cmds` as one batch and waits for it, however long it takes
    /// (the commands may point into memory that is borrowed only for this
    /// call, so returning earlier would be unsound). The results are
    /// written into `cmds`.
    ///
    /// # Safety
    ///
    /// The user pointers in `cmds` must be valid for the device's accesses
    /// for the duration of the call.
    pub(crate) unsafe fn run(&self, cmds: &mut [VgpuCmd]) -> Result<()> {
        let count = u32::try_from(cmds.len())
            .ok()
            .filter(|n| (1..=sys::MAX_BATCH_CMDS).contains(n))
            .ok_or_else(|| Error::Usage(format!("bad batch length {}", cmds.len())))?;
        let mut s = sys::VgpuSubmit {
            cmds: cmds.as_mut_ptr() as u64,
            count,
            flags: sys::SUBMIT_WAIT,
            timeout_ns: sys::TIMEOUT_INFINITE,
            ..Default::default()
        };
        loop {
            s.fence = 0;
            s.error_index = sys::NO_INDEX;
            s.error = 0;
            // SAFETY: as in `submit`; the commands' pointers are valid
            // until this function returns, and it returns only once the
            // batch completed or was never queued.
            match unsafe { self.ioctl(sys::IOCTL_SUBMIT, &mut s) } {
                Ok(()) => return cmd_outcome(cmds, s.error_index, s.error),
                // Nothing queued (interrupted while waiting for ring space).
                Err(Error::Interrupted) if s.fence == 0 => continue,
                Err(Error::Interrupted | Error::TimedOut) => {
                    // Queued: wait until it completes, signals or not.
                    loop {
                        match self.wait(s.fence, None, Some(cmds)) {
                            Ok(None) => return Ok(()),
                            Ok(Some((index, error))) => {
                                return cmd_outcome(cmds, index, error);
                            }
                            Err(Error::Interrupted) => continue,
                            Err(e) => return Err(e),
                        }
                    }
                }
                Err(e) => return Err(rejected(e, s.error_index)),
            }
        }
    }
}

/// The error of a refused SUBMIT.
fn rejected(e: Error, index: u32) -> Error {
    if index == sys::NO_INDEX {
        e
    } else {
        Error::Rejected {
            index: index as usize,
            source: Box::new(e),
        }
    }
}

/// The batch outcome: `error` is the first failed command's negative
/// errno, or 0.
fn cmd_outcome(cmds: &[VgpuCmd], index: u32, error: i32) -> Result<()> {
    if error == 0 {
        return Ok(());
    }
    let status = cmds.get(index as usize).map_or(0, |c| c.status);
    Err(Error::Command {
        index: index as usize,
        status,
        source: Box::new(Error::from_errno(-error)),
    })
}
