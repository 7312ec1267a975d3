//! Batches of commands submitted together and waited for later.

use std::sync::Arc;
use std::time::Duration;

use vgpu_abi::ByteValued;

use crate::error::{Error, Result};
use crate::file::Inner;
use crate::launch::{launch_cluster_cmd, launch_cmd, BuiltinKernel, Dims, Function};
use crate::resources::{Buffer, Module};
use crate::sys::{self, VgpuCmd};

/// Result of one command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CmdResult {
    /// Device completion status (`sys::CMD_STATUS_*`).
    pub status: u32,
    /// 0 or the negative errno matching `status`.
    pub error: i32,
    /// MODULE_LOAD: the module handle; TIMESTAMP: the device clock (ns).
    pub result: u64,
    /// Device time the command took, ns.
    pub device_ns: u64,
    /// MODULE_LOAD: [`sys::MODULE_PRINTS`]; CONSOLE: bytes dropped;
    /// FUNC_INFO of a global: its size.
    pub result2: u64,
}

impl From<&VgpuCmd> for CmdResult {
    fn from(c: &VgpuCmd) -> Self {
        CmdResult {
            status: c.status,
            error: c.error,
            result: c.result,
            device_ns: c.device_ns,
            result2: c.result2,
        }
    }
}

impl CmdResult {
    /// `Ok` unless the command failed.
    pub fn check(&self, index: usize) -> Result<()> {
        if self.error == 0 && self.status == sys::CMD_STATUS_OK {
            return Ok(());
        }
        let errno = if self.error != 0 {
            -self.error
        } else {
            libc::EIO
        };
        Err(Error::Command {
            index,
            status: self.status,
            source: Box::new(Error::from_errno(errno)),
        })
    }
}

/// Where the data of a [`Batch::copy_from_device`] lands; read it from
/// the [`Completed`] batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadSlot(usize);

/// A batch of commands, built up and then submitted with
/// [`crate::Device::submit`] (or run with [`crate::Device::run`]).
///
/// The batch owns the host memory its copies read and write: data given
/// to [`Batch::copy_to_device`] is copied in, and reads land in buffers
/// of the batch. So a submitted batch borrows nothing from the caller.
/// Builder errors (a range outside a buffer, too many commands) are
/// reported by `submit`. Commands run in order; a failed command does not
/// stop the ones after it.
#[derive(Default)]
pub struct Batch {
    cmds: Vec<VgpuCmd>,
    /// Host memory the commands point into. Boxed slices do not move when
    /// this vector grows or the batch moves.
    host: Vec<Box<[u8]>>,
    /// Launch parameters, packed into chunks of [`ARENA_CHUNK`] bytes (a
    /// launch loop then allocates once per chunk, not once per launch);
    /// the last chunk's first `arena_used` bytes are taken.
    arena: Vec<Box<[u8]>>,
    arena_used: usize,
    error: Option<Error>,
}

/// Bytes of one chunk of packed launch parameters; blocks of more than a
/// sixteenth of it get a buffer of their own.
const ARENA_CHUNK: usize = 16 << 10;

impl std::fmt::Debug for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch")
            .field("cmds", &self.cmds.len())
            .field("host_buffers", &self.host.len())
            .field("error", &self.error)
            .finish()
    }
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Batch {
        Batch::default()
    }

    /// Commands so far.
    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    /// No commands yet.
    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    fn fail(&mut self, e: Error) -> &mut Self {
        if self.error.is_none() {
            self.error = Some(e);
        }
        self
    }

    /// `then` with the device address of the `len` bytes at `offset` in
    /// `buf`; where they do not lie in it, the batch fails instead.
    fn in_buffer(
        &mut self,
        buf: &Buffer,
        offset: u64,
        len: u64,
        then: impl FnOnce(&mut Self, u64) -> &mut Self,
    ) -> &mut Self {
        match buf.range(offset, len) {
            Ok(addr) => then(self, addr),
            Err(e) => self.fail(e),
        }
    }

    fn push(&mut self, cmd: VgpuCmd) -> &mut Self {
        if self.cmds.len() >= sys::MAX_BATCH_CMDS as usize {
            return self.fail(Error::Usage(format!(
                "a batch holds at most {} commands",
                sys::MAX_BATCH_CMDS
            )));
        }
        self.cmds.push(cmd);
        self
    }

    /// Keeps `data` in the batch; returns its address.
    fn keep(&mut self, data: Box<[u8]>) -> u64 {
        let addr = data.as_ptr() as u64;
        self.host.push(data);
        addr
    }

    /// A NOP.
    pub fn nop(&mut self) -> &mut Self {
        self.push(VgpuCmd::bare(sys::CMD_NOP, 0))
    }

    /// A FENCE (ordering point; with `irq`, the device interrupts).
    pub fn fence(&mut self, irq: bool) -> &mut Self {
        let flags = if irq { sys::CMD_FENCE_IRQ } else { 0 };
        self.push(VgpuCmd::bare(sys::CMD_FENCE, flags))
    }

    /// A WRITE_VALUE: once the commands before it are done, the device
    /// writes `value` to the word at `addr` (8-byte aligned, or a 32-bit
    /// word, 4-byte aligned, with `wide` false), which must lie in memory
    /// the device file pinned ([`Device::pin`]).
    ///
    /// [`Device::pin`]: crate::Device::pin
    pub fn write_value(&mut self, addr: *const u8, value: u64, wide: bool) -> &mut Self {
        let flags = if wide { 0 } else { sys::CMD_VALUE_32 };
        self.push(VgpuCmd::value(
            sys::CMD_WRITE_VALUE,
            flags,
            sys::VgpuValueArgs {
                addr: addr as u64,
                value,
            },
        ))
    }

    /// A WAIT_VALUE: the file's later commands wait until the word at
    /// `addr` (as for [`Batch::write_value`]) meets `cond`
    /// (`sys::CMD_WAIT_*`) against `value`; other files' commands go on.
    pub fn wait_value(&mut self, addr: *const u8, value: u64, cond: u32, wide: bool) -> &mut Self {
        let flags = cond | if wide { 0 } else { sys::CMD_VALUE_32 };
        self.push(VgpuCmd::value(
            sys::CMD_WAIT_VALUE,
            flags,
            sys::VgpuValueArgs {
                addr: addr as u64,
                value,
            },
        ))
    }

    /// A TIMESTAMP; returns the command's index (its result is the clock).
    pub fn timestamp(&mut self) -> usize {
        self.push(VgpuCmd::bare(sys::CMD_TIMESTAMP, 0));
        self.cmds.len() - 1
    }

    /// One COPY of `size` bytes between memories of `kinds` (source, destination).
    fn copy_cmd(&mut self, kinds: (u32, u32), src: u64, dst: u64, size: u64) -> &mut Self {
        self.push(VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: kinds.0,
            dst_kind: kinds.1,
            src,
            dst,
            size,
        }))
    }

    /// COPYs of `len` bytes, split at the driver's limit for a user side.
    fn copy_cmds(&mut self, kinds: (u32, u32), src: u64, dst: u64, len: u64) -> &mut Self {
        let mut off = 0;
        while off < len {
            let n = (len - off).min(sys::MAX_COPY_BYTES);
            self.copy_cmd(kinds, src + off, dst + off, n);
            off += n;
        }
        self
    }

    /// Copies `data` (copied into the batch now) to `offset` in `buf`.
    pub fn copy_to_device(&mut self, buf: &Buffer, offset: u64, data: &[u8]) -> &mut Self {
        self.in_buffer(buf, offset, data.len() as u64, |b, dst| {
            b.copy_to_device_addr(dst, data)
        })
    }

    /// Copies `data` (copied into the batch now) to device address `dst`,
    /// which must lie in an allocation of this file.
    pub fn copy_to_device_addr(&mut self, dst: u64, data: &[u8]) -> &mut Self {
        if data.is_empty() {
            return self;
        }
        let src = self.keep(data.into());
        self.copy_cmds(
            (sys::MEM_USER, sys::MEM_DEVICE),
            src,
            dst,
            data.len() as u64,
        )
    }

    /// Copies `len` bytes of the caller's memory at `src` to device
    /// address `dst` as the device runs the batch, without copying them
    /// into the batch.
    ///
    /// # Safety
    /// `src .. src + len` must stay mapped, readable memory of this
    /// process until the batch has completed.
    pub unsafe fn copy_user_to_device_addr(
        &mut self,
        dst: u64,
        src: *const u8,
        len: u64,
    ) -> &mut Self {
        self.copy_cmds((sys::MEM_USER, sys::MEM_DEVICE), src as u64, dst, len)
    }

    /// Copies `len` bytes from device address `src` into the caller's
    /// memory at `dst` as the device runs the batch.
    ///
    /// # Safety
    /// `dst .. dst + len` must stay mapped, writable memory of this
    /// process that nothing else uses until the batch has completed.
    pub unsafe fn copy_device_addr_to_user(
        &mut self,
        dst: *mut u8,
        src: u64,
        len: u64,
    ) -> &mut Self {
        self.copy_cmds((sys::MEM_DEVICE, sys::MEM_USER), src, dst as u64, len)
    }

    /// Copies `len` bytes from `offset` in `buf` into a buffer of the
    /// batch, read from [`Completed::read`].
    pub fn copy_from_device(&mut self, buf: &Buffer, offset: u64, len: usize) -> ReadSlot {
        let slot = ReadSlot(self.host.len());
        let dst = self.keep(vec![0u8; len].into_boxed_slice());
        self.in_buffer(buf, offset, len as u64, |b, src| {
            b.copy_cmds((sys::MEM_DEVICE, sys::MEM_USER), src, dst, len as u64)
        });
        slot
    }

    /// Copies `len` bytes between two buffers.
    pub fn copy_device(
        &mut self,
        dst: &Buffer,
        dst_offset: u64,
        src: &Buffer,
        src_offset: u64,
        len: u64,
    ) -> &mut Self {
        match (dst.range(dst_offset, len), src.range(src_offset, len)) {
            (Ok(d), Ok(s)) => self.copy_device_addr(d, s, len),
            (Err(e), _) | (_, Err(e)) => self.fail(e),
        }
    }

    /// Copies `len` bytes between device addresses (both must belong to
    /// this file, or the driver refuses the batch).
    pub fn copy_device_addr(&mut self, dst: u64, src: u64, len: u64) -> &mut Self {
        self.copy_cmd((sys::MEM_DEVICE, sys::MEM_DEVICE), src, dst, len)
    }

    /// Copies `len` bytes from window offset `window_offset` to `offset`
    /// in `buf`.
    pub fn copy_window_to_device(
        &mut self,
        buf: &Buffer,
        offset: u64,
        window_offset: u64,
        len: u64,
    ) -> &mut Self {
        self.in_buffer(buf, offset, len, |b, d| {
            b.copy_cmd((sys::MEM_WINDOW, sys::MEM_DEVICE), window_offset, d, len)
        })
    }

    /// Copies `len` bytes from `offset` in `buf` to window offset
    /// `window_offset`.
    pub fn copy_device_to_window(
        &mut self,
        window_offset: u64,
        buf: &Buffer,
        offset: u64,
        len: u64,
    ) -> &mut Self {
        self.in_buffer(buf, offset, len, |b, s| {
            b.copy_cmd((sys::MEM_DEVICE, sys::MEM_WINDOW), s, window_offset, len)
        })
    }

    /// Fills `len` bytes (a multiple of 4) at `offset` in `buf`.
    pub fn fill(&mut self, buf: &Buffer, offset: u64, len: u64, pattern: u32) -> &mut Self {
        self.in_buffer(buf, offset, len, |b, a| b.fill_addr(a, len, pattern))
    }

    /// Fills `len` bytes at device address `addr`.
    pub fn fill_addr(&mut self, addr: u64, len: u64, pattern: u32) -> &mut Self {
        self.push(VgpuCmd::fill(sys::VgpuFillArgs {
            addr,
            size: len,
            pattern,
            pad: 0,
        }))
    }

    /// Runs a built-in kernel on one block of 256 threads.
    pub fn launch_builtin<P: ByteValued>(&mut self, entry: &str, params: &P) -> &mut Self {
        self.launch_builtin_dims(entry, Dims::default(), params)
    }

    /// Runs a built-in kernel with a launch shape.
    pub fn launch_builtin_dims<P: ByteValued>(
        &mut self,
        entry: &str,
        dims: Dims,
        params: &P,
    ) -> &mut Self {
        self.launch_raw(sys::MODULE_BUILTIN_ID, entry, dims, params.as_slice())
    }

    /// Runs a built-in kernel with a parameter block given as bytes.
    pub fn launch_builtin_bytes(&mut self, entry: &str, dims: Dims, params: &[u8]) -> &mut Self {
        self.launch_raw(sys::MODULE_BUILTIN_ID, entry, dims, params)
    }

    /// Runs the built-in kernel of a parameter block with its own shape.
    pub fn run_kernel<K: BuiltinKernel>(&mut self, params: &K) -> &mut Self {
        self.launch_builtin_dims(K::ENTRY, params.dims(), params)
    }

    /// Runs entry point `entry` of a loaded module.
    pub fn launch(&mut self, module: &Module, entry: &str, dims: Dims, params: &[u8]) -> &mut Self {
        self.launch_raw(module.handle(), entry, dims, params)
    }

    /// Runs `f` (from [`Device::function`](crate::Device::function)).
    pub fn launch_function(&mut self, f: &Function, dims: Dims, params: &[u8]) -> &mut Self {
        self.launch_function_in_clusters(f, dims, [1, 1, 1], params)
    }

    /// Runs `f` in thread block clusters of `cluster` blocks.
    pub fn launch_function_in_clusters(
        &mut self,
        f: &Function,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
    ) -> &mut Self {
        self.push_launch(params, |kept| {
            launch_cluster_cmd(f, dims, cluster, false, kept)
        })
    }

    /// Runs `f` as a cooperative launch (in clusters of `cluster`
    /// blocks): every block of the grid resident at once, so that the
    /// grid can synchronise. The device must offer
    /// [`FEATURE_COOPERATIVE`](crate::sys::FEATURE_COOPERATIVE); a grid
    /// larger than [`Device::max_active_clusters`](crate::Device::max_active_clusters) says
    /// fits fails.
    pub fn launch_function_cooperative(
        &mut self,
        f: &Function,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
    ) -> &mut Self {
        self.push_launch(params, |kept| {
            launch_cluster_cmd(f, dims, cluster, true, kept)
        })
    }

    fn launch_raw(&mut self, module: u64, entry: &str, dims: Dims, params: &[u8]) -> &mut Self {
        self.push_launch(params, |kept| launch_cmd(module, entry, dims, kept))
    }

    /// Pushes the LAUNCH `build` makes of a copy of `params` that the batch
    /// keeps alive until it completes (the command points into it).
    fn push_launch(
        &mut self,
        params: &[u8],
        build: impl FnOnce(&[u8]) -> Result<VgpuCmd>,
    ) -> &mut Self {
        match self.try_push_launch(params, build) {
            Ok(()) => self,
            Err(e) => self.fail(e),
        }
    }

    /// [`Self::push_launch`], leaving the batch as it was (and usable)
    /// when the launch cannot be built.
    fn try_push_launch(
        &mut self,
        params: &[u8],
        build: impl FnOnce(&[u8]) -> Result<VgpuCmd>,
    ) -> Result<()> {
        if self.cmds.len() >= sys::MAX_BATCH_CMDS as usize {
            return Err(Error::Usage(format!(
                "a batch holds at most {} commands",
                sys::MAX_BATCH_CMDS
            )));
        }
        let cmd = if params.len() > ARENA_CHUNK / 16 {
            let kept: Box<[u8]> = params.into();
            let cmd = build(&kept)?;
            self.host.push(kept);
            cmd
        } else {
            // 8-byte aligned, as a buffer of its own would be.
            let at = self.arena_used.next_multiple_of(8);
            if self.arena.is_empty() || at + params.len() > ARENA_CHUNK {
                self.arena.push(vec![0u8; ARENA_CHUNK].into_boxed_slice());
                self.arena_used = 0;
            }
            let at = self.arena_used.next_multiple_of(8);
            let chunk = self.arena.last_mut().expect("a chunk was just ensured");
            chunk[at..at + params.len()].copy_from_slice(params);
            let cmd = build(&chunk[at..at + params.len()])?;
            self.arena_used = at + params.len();
            cmd
        };
        self.cmds.push(cmd);
        Ok(())
    }

    /// [`Self::launch_function_in_clusters`], refusing a launch that
    /// cannot be built here instead of failing the whole batch: the
    /// batch stays as it was. For callers that add one command at a time
    /// to a batch shared by many calls.
    pub fn try_launch_function_in_clusters(
        &mut self,
        f: &Function,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
    ) -> Result<()> {
        self.try_push_launch(params, |kept| {
            launch_cluster_cmd(f, dims, cluster, false, kept)
        })
    }

    /// [`Self::launch_function_cooperative`], refusing a launch that
    /// cannot be built here instead of failing the whole batch, as
    /// [`Self::try_launch_function_in_clusters`] does.
    pub fn try_launch_function_cooperative(
        &mut self,
        f: &Function,
        dims: Dims,
        cluster: [u32; 3],
        params: &[u8],
    ) -> Result<()> {
        self.try_push_launch(params, |kept| {
            launch_cluster_cmd(f, dims, cluster, true, kept)
        })
    }

    /// Appends a raw command.
    ///
    /// # Safety
    ///
    /// Every user pointer in `cmd` must stay valid for the device's
    /// accesses until the batch completes (and, for destinations, must not
    /// be memory Rust code uses meanwhile).
    pub unsafe fn push_raw(&mut self, cmd: VgpuCmd) -> &mut Self {
        self.push(cmd)
    }

    /// Moves the commands of `other` (and the host memory they use) to
    /// the end of this batch. A batch that failed to build is refused
    /// whole with its error, as is one that would make this batch too
    /// long; this batch is then unchanged.
    pub fn append(&mut self, mut other: Batch) -> Result<()> {
        if let Some(e) = other.error.take() {
            return Err(e);
        }
        if self.cmds.len() + other.cmds.len() > sys::MAX_BATCH_CMDS as usize {
            return Err(Error::Usage(format!(
                "a batch holds at most {} commands",
                sys::MAX_BATCH_CMDS
            )));
        }
        self.cmds.append(&mut other.cmds);
        self.host.append(&mut other.host);
        if !other.arena.is_empty() {
            // The other batch's last chunk becomes the one to fill.
            self.arena.append(&mut other.arena);
            self.arena_used = other.arena_used;
        }
        Ok(())
    }

    pub(crate) fn take_error(&mut self) -> Result<()> {
        match self.error.take() {
            Some(e) => Err(e),
            None if self.cmds.is_empty() => Err(Error::Usage("empty batch".into())),
            None => Ok(()),
        }
    }

    pub(crate) fn cmds_mut(&mut self) -> &mut [VgpuCmd] {
        &mut self.cmds
    }
}

/// A submitted batch. [`Pending::wait`] collects it.
///
/// Dropping a `Pending` that was not collected waits for the batch
/// first, because the device may still write into host memory the batch
/// owns. `mem::forget` on it is safe: the memory then leaks.
pub struct Pending {
    dev: Arc<Inner>,
    fence: u64,
    batch: Option<Batch>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("fence", &self.fence)
            .field("collected", &self.batch.is_none())
            .finish()
    }
}

impl Pending {
    pub(crate) fn new(dev: Arc<Inner>, fence: u64, batch: Batch) -> Pending {
        Pending {
            dev,
            fence,
            batch: Some(batch),
        }
    }

    /// The batch's fence (1, 2, 3, ... per open file).
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Waits up to `timeout` (`None`: no limit; `Some(ZERO)` polls) for
    /// the batch and collects its results. [`Error::TimedOut`] and
    /// [`Error::Interrupted`] leave it pending. A batch whose commands
    /// failed still completes: see [`Completed::check`].
    pub fn wait(&mut self, timeout: Option<Duration>) -> Result<Completed> {
        let Some(batch) = self.batch.as_mut() else {
            return Err(Error::Usage("batch already collected".into()));
        };
        self.dev.wait(self.fence, timeout, Some(batch.cmds_mut()))?;
        let batch = self.batch.take().unwrap_or_default();
        Ok(Completed {
            fence: self.fence,
            cmds: batch.cmds,
            host: batch.host,
        })
    }

    /// Whether the batch has been collected.
    pub fn is_collected(&self) -> bool {
        self.batch.is_none()
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        let Some(mut batch) = self.batch.take() else {
            return;
        };
        loop {
            match self.dev.wait(self.fence, None, Some(batch.cmds_mut())) {
                Err(Error::Interrupted) => continue,
                // The device is done with the batch's memory.
                Ok(_) => return,
                Err(_) => {
                    // Whether the device is done is unknown: never hand
                    // the memory back to the allocator.
                    std::mem::forget(batch);
                    return;
                }
            }
        }
    }
}

/// A collected batch: per-command results and the data read back.
pub struct Completed {
    fence: u64,
    cmds: Vec<VgpuCmd>,
    host: Vec<Box<[u8]>>,
}

impl std::fmt::Debug for Completed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completed")
            .field("fence", &self.fence)
            .field("results", &self.results())
            .finish()
    }
}

impl Completed {
    /// The batch's fence.
    pub fn fence(&self) -> u64 {
        self.fence
    }

    /// Results, one per command.
    pub fn results(&self) -> Vec<CmdResult> {
        self.cmds.iter().map(CmdResult::from).collect()
    }

    /// Result of command `index`.
    pub fn result(&self, index: usize) -> Option<CmdResult> {
        self.cmds.get(index).map(CmdResult::from)
    }

    /// Device time of all commands, ns.
    pub fn device_ns(&self) -> u64 {
        self.cmds.iter().map(|c| c.device_ns).sum()
    }

    /// The first failed command, as an error.
    pub fn check(&self) -> Result<()> {
        for (i, c) in self.cmds.iter().enumerate() {
            CmdResult::from(c).check(i)?;
        }
        Ok(())
    }

    /// The bytes a [`Batch::copy_from_device`] read.
    pub fn read(&self, slot: ReadSlot) -> &[u8] {
        self.host.get(slot.0).map_or(&[], |b| &b[..])
    }

    /// Takes the bytes a [`Batch::copy_from_device`] read.
    pub fn take(&mut self, slot: ReadSlot) -> Vec<u8> {
        self.host
            .get_mut(slot.0)
            .map(|b| std::mem::take(b).into_vec())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_cmd_result_check() {
        assert!(CmdResult::default().check(0).is_ok());
        let r = CmdResult {
            status: sys::CMD_STATUS_OUT_OF_RANGE,
            error: -libc::ERANGE,
            ..Default::default()
        };
        assert_eq!(r.check(3).unwrap_err().errno(), libc::ERANGE);
        let r = CmdResult {
            status: sys::CMD_STATUS_DEVICE_ERROR,
            error: 0,
            ..Default::default()
        };
        assert_eq!(r.check(0).unwrap_err().errno(), libc::EIO);
    }

    #[test]
    fn test_batch_builder_errors_are_reported_at_submit() {
        let mut b = Batch::new();
        assert!(matches!(b.take_error(), Err(Error::Usage(_))));
        b.nop().fence(true);
        let i = b.timestamp();
        assert_eq!(i, 2);
        assert!(b.take_error().is_ok());
        for _ in 0..300 {
            b.nop();
        }
        assert_eq!(b.len(), sys::MAX_BATCH_CMDS as usize);
        assert!(matches!(b.take_error(), Err(Error::Usage(_))));
        let mut b = Batch::new();
        b.launch_builtin("no\0such", &0u64);
        assert!(matches!(b.take_error(), Err(Error::Usage(_))));
    }

    #[test]
    fn test_batch_owns_launch_params() {
        let mut b = Batch::new();
        {
            let p = vgpu_abi::FillParams {
                dst: 0x100,
                count: 4,
                value: 7,
                reserved: 0,
            };
            b.run_kernel(&p);
        }
        let c = b.cmds[0];
        // SAFETY: built as a launch.
        let l = unsafe { c.args.launch };
        assert_eq!(l.params, b.arena[0].as_ptr() as u64);
        assert_eq!(l.params_size, 24);
        assert_eq!(&b.arena[0][..8], &0x100u64.to_le_bytes());
    }

    /// The parameters each launch command points at.
    fn launch_params(b: &Batch) -> Vec<Vec<u8>> {
        b.cmds
            .iter()
            .map(|c| {
                // SAFETY: built as launches; each points into the batch's
                // own memory, alive as long as `b`.
                unsafe {
                    let l = c.args.launch;
                    std::slice::from_raw_parts(l.params as *const u8, l.params_size as usize)
                        .to_vec()
                }
            })
            .collect()
    }

    /// A function (no device behind it) and a one-thread shape.
    fn one_function() -> (Function, Dims) {
        let f = Function {
            module: 1,
            handle: 2,
            info: Default::default(),
            params: Vec::new(),
        };
        let dims = Dims {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
        };
        (f, dims)
    }

    #[test]
    fn test_launch_params_pack_into_chunks_and_stay_put() {
        let (f, dims) = one_function();
        let mut b = Batch::new();
        let mut want = Vec::new();
        // Enough 1000-byte blocks to fill more than one chunk, and one
        // block too large for a chunk.
        for i in 0..40u8 {
            let p = vec![
                i;
                if i == 20 {
                    sys::MAX_PARAMS_BYTES as usize
                } else {
                    1000
                }
            ];
            b.try_launch_function_in_clusters(&f, dims, [1, 1, 1], &p)
                .unwrap();
            want.push(p);
        }
        assert!(b.arena.len() >= 3, "{} chunks", b.arena.len());
        assert_eq!(b.host.len(), 1, "the large block has its own buffer");
        assert!(b.cmds.iter().all(|c| {
            // SAFETY: built as launches.
            unsafe { c.args.launch }.params % 8 == 0
        }));
        // Moving the batch into another moves no parameters.
        let mut a = Batch::new();
        a.try_launch_function_in_clusters(&f, dims, [1, 1, 1], &[9; 16])
            .unwrap();
        a.append(b).unwrap();
        want.insert(0, vec![9; 16]);
        assert_eq!(launch_params(&a), want);
        // And the next launch goes on in the appended batch's last chunk.
        a.try_launch_function_in_clusters(&f, dims, [1, 1, 1], &[7; 8])
            .unwrap();
        want.push(vec![7; 8]);
        assert_eq!(launch_params(&a), want);
    }

    #[test]
    fn test_a_launch_that_cannot_be_built_leaves_the_batch_usable() {
        let (f, dims) = one_function();
        let mut b = Batch::new();
        b.nop();
        let huge = vec![0u8; sys::MAX_PARAMS_BYTES as usize + 1];
        assert!(matches!(
            b.try_launch_function_in_clusters(&f, dims, [1, 1, 1], &huge),
            Err(Error::TooBig)
        ));
        assert_eq!(b.len(), 1);
        assert!(b.take_error().is_ok());
        for _ in 1..sys::MAX_BATCH_CMDS {
            b.nop();
        }
        assert!(matches!(
            b.try_launch_function_in_clusters(&f, dims, [1, 1, 1], &[1]),
            Err(Error::Usage(_))
        ));
        assert!(b.take_error().is_ok());
    }

    #[test]
    fn test_append_moves_commands_and_their_memory_or_nothing() {
        let mut a = Batch::new();
        a.nop();
        let mut b = Batch::new();
        b.copy_to_device_addr(0x1000, &[1, 2, 3, 4]).timestamp();
        let data = b.host[0].as_ptr() as u64;
        a.append(b).unwrap();
        assert_eq!(a.len(), 3);
        // The copy still points at its data, now owned by `a`.
        // SAFETY: built as a copy.
        assert_eq!(unsafe { a.cmds[1].args.copy }.src, data);
        assert_eq!(a.host.len(), 1);
        let mut bad = Batch::new();
        bad.launch_builtin("no\0such", &0u64);
        assert!(matches!(a.append(bad), Err(Error::Usage(_))));
        let mut full = Batch::new();
        for _ in 0..sys::MAX_BATCH_CMDS {
            full.nop();
        }
        assert!(a.append(full).is_err());
        assert_eq!(a.len(), 3);
    }
}
