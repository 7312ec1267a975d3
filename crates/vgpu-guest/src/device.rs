//! `/dev/vgpuN`: device memory, synchronous operations, modules and the
//! window.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Arc;

use vgpu_abi::{self as abi, ByteValued};

use crate::batch::{Batch, CmdResult, Completed, Pending};
use crate::error::{Error, Result};
use crate::file::Inner;
use crate::launch::{launch_cmd, launch_function_cmd, BuiltinKernel, Dims, Function};
use crate::resources::{Buffer, Module};
use crate::sys::{self, VgpuCmd, VgpuInfo, VgpuUsage};

/// An open vgpu function, `/dev/vgpuN`.
///
/// Everything allocated or loaded through it belongs to this open file:
/// other files (other processes) cannot name it, and the driver frees it
/// when the file is closed. The commands of one `Device` run in
/// submission order. `Device` is `Send + Sync`; threads may share it.
pub struct Device {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("path", &self.inner.path)
            .field("fd", &self.inner.file.as_raw_fd())
            .finish()
    }
}

impl Device {
    /// Opens a vgpu device file and checks the driver's uapi version.
    pub fn open(path: impl AsRef<Path>) -> Result<Device> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| Error::Open {
                path: path.clone(),
                source,
            })?;
        let mut inner = Inner {
            file,
            path,
            info: VgpuInfo::default(),
            owner: None,
        };
        inner.info = inner.query_info()?;
        if inner.info.uapi_version != sys::UAPI_VERSION {
            return Err(Error::Version {
                path: inner.path,
                found: inner.info.uapi_version,
                expected: sys::UAPI_VERSION,
            });
        }
        Ok(Device {
            inner: Arc::new(inner),
        })
    }

    /// Opens another file of the same function as a lane of this one
    /// (VGPU_IOCTL_LANE): its commands go to another of the function's
    /// queues, in order among themselves and side by side with this
    /// file's, on this file's device memory, modules and pinned ranges.
    /// A lane runs stream work (copies, fills, launches, timestamps,
    /// fences, [`Batch::write_value`] and [`Batch::wait_value`]);
    /// allocations, modules and pins stay with this file, which the lane
    /// keeps open. Returns the lane and its queue. A driver without lanes
    /// answers [`Error::NotVgpu`] (ENOTTY).
    ///
    /// [`Batch::write_value`]: crate::Batch::write_value
    /// [`Batch::wait_value`]: crate::Batch::wait_value
    pub fn lane(&self) -> Result<(Device, u32)> {
        let lane = Device::open(&self.inner.path)?;
        let mut a = sys::VgpuLane {
            fd: self.inner.file.as_raw_fd(),
            queue: 0,
        };
        // SAFETY: IOCTL_LANE reads and writes one `VgpuLane`.
        unsafe { lane.inner.ioctl(sys::IOCTL_LANE, &mut a) }?;
        let Ok(mut inner) = Arc::try_unwrap(lane.inner) else {
            unreachable!("a device just opened has one owner");
        };
        inner.owner = Some(Arc::clone(&self.inner));
        Ok((
            Device {
                inner: Arc::new(inner),
            },
            a.queue,
        ))
    }

    /// Opens `/dev/vgpu<n>`.
    pub fn open_index(n: u32) -> Result<Device> {
        Device::open(format!("/dev/vgpu{n}"))
    }

    /// The vgpu device files present, `(N, /dev/vgpuN)`, by N.
    pub fn list() -> Vec<(u32, PathBuf)> {
        let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir("/dev")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let n = name.strip_prefix("vgpu")?.parse().ok()?;
                Some((n, e.path()))
            })
            .collect();
        out.sort();
        out
    }

    /// The device file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Identity and setup, as read when the device was opened.
    pub fn cached_info(&self) -> &VgpuInfo {
        &self.inner.info
    }

    /// Identity and setup (VGPU_IOCTL_INFO).
    pub fn info(&self) -> Result<VgpuInfo> {
        self.inner.query_info()
    }

    /// Counters of the function and of this file (VGPU_IOCTL_USAGE).
    pub fn usage(&self) -> Result<VgpuUsage> {
        let mut u = VgpuUsage::default();
        // SAFETY: IOCTL_USAGE writes one `VgpuUsage`; no pointers inside.
        unsafe { self.inner.ioctl(sys::IOCTL_USAGE, &mut u) }?;
        Ok(u)
    }

    /// Pins `len` bytes at `addr` (page-aligned) and maps them for the
    /// device once (VGPU_IOCTL_PIN): later copies inside the range skip
    /// pinning their pages. The range must stay mapped until [`unpin`]
    /// or until this device is closed. A driver without the call answers
    /// [`Error::NotVgpu`] (ENOTTY).
    ///
    /// [`unpin`]: Self::unpin
    pub fn pin(&self, addr: *const u8, len: usize) -> Result<()> {
        let mut a = sys::VgpuPin {
            addr: addr as u64,
            size: len as u64,
        };
        // SAFETY: IOCTL_PIN reads one `VgpuPin`; the driver checks the
        // range itself (it pins only the caller's own mapped memory).
        unsafe { self.inner.ioctl(sys::IOCTL_PIN, &mut a) }
    }

    /// Ends a range [`pin`](Self::pin) made (VGPU_IOCTL_UNPIN).
    pub fn unpin(&self, addr: *const u8) -> Result<()> {
        let mut a = sys::VgpuPin {
            addr: addr as u64,
            size: 0,
        };
        // SAFETY: IOCTL_UNPIN reads one `VgpuPin`.
        unsafe { self.inner.ioctl(sys::IOCTL_UNPIN, &mut a) }
    }

    /// Allocates `size` bytes of device memory (default alignment, 256).
    /// Quota exhaustion is [`Error::OutOfMemory`]. Device memory starts
    /// zeroed.
    pub fn alloc(&self, size: u64) -> Result<Buffer> {
        self.alloc_aligned(size, 0)
    }

    /// Allocates `size` bytes aligned to `align` (a power of two, or 0).
    pub fn alloc_aligned(&self, size: u64, align: u64) -> Result<Buffer> {
        let mut a = sys::VgpuAlloc {
            size,
            align,
            ..Default::default()
        };
        // SAFETY: IOCTL_ALLOC reads and writes one `VgpuAlloc`; no
        // pointers inside.
        unsafe { self.inner.ioctl(sys::IOCTL_ALLOC, &mut a) }?;
        Ok(Buffer {
            dev: self.inner.clone(),
            addr: a.addr,
            size,
            owned: true,
        })
    }

    /// Frees an allocation by address (the one [`Buffer::into_raw`] gave
    /// up). ENOENT if this file has no allocation starting there.
    pub fn free_raw(&self, addr: u64) -> Result<()> {
        self.inner.free(addr)
    }

    /// Whether the function offers virtual memory management
    /// ([`Device::vmm_reserve`] and the rest).
    pub fn has_vmm(&self) -> bool {
        self.cached_info().flags & sys::INFO_VMM != 0
    }

    /// One VGPU_IOCTL_VMM operation; returns the argument as the driver
    /// left it.
    fn vmm(&self, mut v: sys::VgpuVmm) -> Result<sys::VgpuVmm> {
        // SAFETY: IOCTL_VMM reads and writes one `VgpuVmm`; no pointers
        // inside.
        unsafe { self.inner.ioctl(sys::IOCTL_VMM, &mut v) }?;
        Ok(v)
    }

    /// Reserves `size` bytes of device addresses (a multiple of
    /// [`sys::VMM_GRANULE`]) aligned to `align` (0: the granule), at
    /// `want` if that is free (0: anywhere); returns the first address.
    /// Nothing is behind the range until [`Device::vmm_map`].
    pub fn vmm_reserve(&self, size: u64, align: u64, want: u64) -> Result<u64> {
        let v = self.vmm(sys::VgpuVmm {
            op: sys::VMM_RESERVE,
            addr: want,
            size,
            align,
            ..Default::default()
        })?;
        Ok(v.addr)
    }

    /// Frees the reservation at `addr` of `size` bytes (nothing mapped in
    /// it any more).
    pub fn vmm_free(&self, addr: u64, size: u64) -> Result<()> {
        self.vmm(sys::VgpuVmm {
            op: sys::VMM_FREE,
            addr,
            size,
            ..Default::default()
        })
        .map(drop)
    }

    /// Makes a physical allocation of `size` bytes (zeroed, charged to
    /// the quota); returns its handle.
    pub fn vmm_create(&self, size: u64) -> Result<u64> {
        let v = self.vmm(sys::VgpuVmm {
            op: sys::VMM_CREATE,
            size,
            ..Default::default()
        })?;
        Ok(v.handle)
    }

    /// Releases physical allocation `handle`: its memory goes once
    /// nothing maps it.
    pub fn vmm_release(&self, handle: u64) -> Result<()> {
        self.vmm(sys::VgpuVmm {
            op: sys::VMM_RELEASE,
            handle,
            ..Default::default()
        })
        .map(drop)
    }

    /// Maps `size` bytes of `handle` from `offset` at `addr`, inside one
    /// reservation, where nothing is mapped yet; the mapping has no
    /// access until [`Device::vmm_access`].
    pub fn vmm_map(&self, addr: u64, size: u64, handle: u64, offset: u64) -> Result<()> {
        self.vmm(sys::VgpuVmm {
            op: sys::VMM_MAP,
            addr,
            size,
            handle,
            offset,
            ..Default::default()
        })
        .map(drop)
    }

    /// Unmaps `[addr, addr + size)`, whole mappings.
    pub fn vmm_unmap(&self, addr: u64, size: u64) -> Result<()> {
        self.vmm(sys::VgpuVmm {
            op: sys::VMM_UNMAP,
            addr,
            size,
            ..Default::default()
        })
        .map(drop)
    }

    /// Gives the whole mappings of `[addr, addr + size)` `access`
    /// (`sys::VMM_ACCESS_*`).
    pub fn vmm_access(&self, addr: u64, size: u64, access: u32) -> Result<()> {
        self.vmm(sys::VgpuVmm {
            op: sys::VMM_ACCESS,
            access,
            addr,
            size,
            ..Default::default()
        })
        .map(drop)
    }

    fn check_buffer(&self, buf: &Buffer, offset: u64, len: u64) -> Result<u64> {
        if !Arc::ptr_eq(&self.inner, &buf.dev) {
            return Err(Error::Usage(
                "the buffer belongs to another open device".into(),
            ));
        }
        buf.range(offset, len)
    }

    /// Copies `data` to device memory at `offset` in `buf`, and waits.
    pub fn copy_to_device(&self, buf: &Buffer, offset: u64, data: &[u8]) -> Result<()> {
        let addr = self.check_buffer(buf, offset, data.len() as u64)?;
        self.copy_to_device_addr(addr, data)
    }

    /// Copies from device memory at `offset` in `buf` into `out`, and waits.
    pub fn copy_from_device(&self, buf: &Buffer, offset: u64, out: &mut [u8]) -> Result<()> {
        let addr = self.check_buffer(buf, offset, out.len() as u64)?;
        self.copy_from_device_addr(addr, out)
    }

    /// Copies `data` to device address `addr` (which must lie in an
    /// allocation of this file: the driver refuses anything else with
    /// ENOENT or ERANGE).
    pub fn copy_to_device_addr(&self, addr: u64, data: &[u8]) -> Result<()> {
        self.copy_user(addr, data.as_ptr() as u64, data.len() as u64, true)
    }

    /// Copies from device address `addr` into `out`.
    pub fn copy_from_device_addr(&self, addr: u64, out: &mut [u8]) -> Result<()> {
        self.copy_user(addr, out.as_mut_ptr() as u64, out.len() as u64, false)
    }

    /// COPY between user memory (`user`, `len` bytes, borrowed by the
    /// caller for this call) and device memory, in pieces the driver
    /// accepts, each one waited for.
    fn copy_user(&self, addr: u64, user: u64, len: u64, to_device: bool) -> Result<()> {
        let mut chunk = sys::MAX_COPY_BYTES;
        let mut off = 0;
        while off < len {
            let n = chunk.min(len - off);
            let (src_kind, src, dst_kind, dst) = if to_device {
                (sys::MEM_USER, user + off, sys::MEM_DEVICE, addr + off)
            } else {
                (sys::MEM_DEVICE, addr + off, sys::MEM_USER, user + off)
            };
            let mut cmd = [VgpuCmd::copy(sys::VgpuCopyArgs {
                src_kind,
                dst_kind,
                src,
                dst,
                size: n,
            })];
            // SAFETY: the user side is `user + off .. + n`, inside the
            // slice the caller borrowed (shared for to-device, exclusive
            // for from-device) for this whole call, and `run` returns only
            // once the device is done with it.
            match unsafe { self.inner.run(&mut cmd) } {
                Ok(()) => off += n,
                // More scatter-gather descriptors than the ring holds:
                // retry in smaller pieces.
                Err(e) if e.errno() == libc::E2BIG && n > 4096 => chunk = n / 2,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Fills `len` bytes (a multiple of 4) at `offset` in `buf` with the
    /// little-endian 32-bit `pattern`.
    pub fn fill(&self, buf: &Buffer, offset: u64, len: u64, pattern: u32) -> Result<()> {
        let addr = self.check_buffer(buf, offset, len)?;
        self.fill_addr(addr, len, pattern)
    }

    /// Fills `len` bytes (a multiple of 4) at device address `addr`, which
    /// must lie in one allocation of this file.
    pub fn fill_addr(&self, addr: u64, len: u64, pattern: u32) -> Result<()> {
        self.run_one(VgpuCmd::fill(sys::VgpuFillArgs {
            addr,
            size: len,
            pattern,
            pad: 0,
        }))
        .map(drop)
    }

    /// Copies `len` bytes between device addresses of this file (each
    /// range inside one allocation).
    pub fn copy_device_addr(&self, dst: u64, src: u64, len: u64) -> Result<()> {
        self.run_one(VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: sys::MEM_DEVICE,
            dst_kind: sys::MEM_DEVICE,
            src,
            dst,
            size: len,
        }))
        .map(drop)
    }

    /// Copies `len` bytes between two buffers of this device.
    pub fn copy_device(
        &self,
        dst: &Buffer,
        dst_offset: u64,
        src: &Buffer,
        src_offset: u64,
        len: u64,
    ) -> Result<()> {
        let d = self.check_buffer(dst, dst_offset, len)?;
        let s = self.check_buffer(src, src_offset, len)?;
        self.copy_device_addr(d, s, len)
    }

    /// Runs a built-in kernel (`fill_u32`, `copy`, `vadd_f32`,
    /// `saxpy_f32`, `sgemm_f32`, `reduce_sum_f32`) with its parameter
    /// block (the matching `vgpu_abi::*Params`) on one block of 256
    /// threads, and waits.
    pub fn launch_builtin<P: ByteValued>(&self, entry: &str, params: &P) -> Result<CmdResult> {
        self.launch_builtin_dims(entry, Dims::default(), params)
    }

    /// [`Device::launch_builtin`] with a launch shape.
    pub fn launch_builtin_dims<P: ByteValued>(
        &self,
        entry: &str,
        dims: Dims,
        params: &P,
    ) -> Result<CmdResult> {
        self.launch_raw(sys::MODULE_BUILTIN_ID, entry, dims, params.as_slice())
    }

    /// Runs a built-in kernel with a parameter block given as bytes.
    pub fn launch_builtin_bytes(
        &self,
        entry: &str,
        dims: Dims,
        params: &[u8],
    ) -> Result<CmdResult> {
        self.launch_raw(sys::MODULE_BUILTIN_ID, entry, dims, params)
    }

    /// Runs the built-in kernel of a parameter block, with its own shape.
    pub fn run_kernel<K: BuiltinKernel>(&self, params: &K) -> Result<CmdResult> {
        self.launch_builtin_dims(K::ENTRY, params.dims(), params)
    }

    /// Runs entry point `entry` of a loaded module.
    pub fn launch(
        &self,
        module: &Module,
        entry: &str,
        dims: Dims,
        params: &[u8],
    ) -> Result<CmdResult> {
        self.launch_raw(module.handle, entry, dims, params)
    }

    fn launch_raw(&self, module: u64, entry: &str, dims: Dims, params: &[u8]) -> Result<CmdResult> {
        let cmd = launch_cmd(module, entry, dims, params)?;
        // The driver copies the parameter block at submit.
        self.run_one(cmd)
    }

    /// Looks up entry point `entry` of `module`: the device describes its
    /// parameters and attributes (as the host's driver knows them) and
    /// gives a handle to launch it by, whatever the length of its name.
    pub fn function(&self, module: &Module, entry: &str) -> Result<Function> {
        if self.inner.info.flags & sys::INFO_FUNC_INFO == 0 {
            return Err(Error::Unsupported);
        }
        if entry.is_empty()
            || entry.len() > sys::MAX_FUNC_NAME_BYTES as usize
            || entry.contains('\0')
        {
            return Err(Error::Usage(format!("bad entry point name {entry:?}")));
        }
        let header = size_of::<abi::FuncInfo>();
        let room = header + abi::MAX_FUNC_PARAMS as usize * size_of::<abi::FuncParam>();
        let scratch = self.alloc(room as u64)?;
        let mut out = vec![0u8; room];
        let mut cmds = [
            VgpuCmd::func_info(sys::VgpuFuncInfoArgs {
                module: module.handle,
                out: scratch.addr(),
                out_size: room as u32,
                name_len: entry.len() as u32,
                name: entry.as_ptr() as u64,
            }),
            VgpuCmd::copy(sys::VgpuCopyArgs {
                src_kind: sys::MEM_DEVICE,
                dst_kind: sys::MEM_USER,
                src: scratch.addr(),
                dst: out.as_mut_ptr() as u64,
                size: room as u64,
            }),
        ];
        // SAFETY: the name and `out` outlive this call, which returns
        // once the device is done with both; nothing else uses `out`.
        unsafe { self.inner.run(&mut cmds) }?;
        let info = abi::FuncInfo::from_slice(&out[..header])
            .copied()
            .ok_or(Error::Io)?;
        let n = (info.param_count as usize).min(abi::MAX_FUNC_PARAMS as usize);
        let params = out[header..header + n * size_of::<abi::FuncParam>()]
            .chunks_exact(size_of::<abi::FuncParam>())
            .filter_map(|p| abi::FuncParam::from_slice(p).copied())
            .collect();
        Ok(Function {
            module: module.handle,
            handle: cmds[0].result,
            info,
            params,
        })
    }

    /// The device address and size of global variable `name` of
    /// `module` (a `__device__` variable), which this file may then copy
    /// to and from until the module is unloaded.
    pub fn global(&self, module: &Module, name: &str) -> Result<(u64, u64)> {
        if self.inner.info.flags & sys::INFO_FUNC_INFO == 0 {
            return Err(Error::Unsupported);
        }
        if name.is_empty() || name.len() > sys::MAX_FUNC_NAME_BYTES as usize || name.contains('\0')
        {
            return Err(Error::Usage(format!("bad global name {name:?}")));
        }
        let scratch = self.alloc(size_of::<abi::GlobalInfo>() as u64)?;
        let mut cmd = [VgpuCmd::func_info(sys::VgpuFuncInfoArgs {
            module: module.handle,
            out: scratch.addr(),
            out_size: size_of::<abi::GlobalInfo>() as u32,
            name_len: name.len() as u32,
            name: name.as_ptr() as u64,
        })];
        cmd[0].flags = sys::CMD_FUNC_INFO_GLOBAL;
        // SAFETY: the name outlives this call, which returns once the
        // device is done with it.
        unsafe { self.inner.run(&mut cmd) }?;
        Ok((cmd[0].result, cmd[0].result2))
    }

    /// How many thread block clusters of `cluster` blocks of `block`
    /// threads, each block with `shared_mem` bytes of dynamic shared
    /// memory, of function `f` the device can hold at once, as the host's
    /// driver counts them (clusters stay within one group of SMs, which
    /// only it knows); 0 when none fits.
    pub fn max_active_clusters(
        &self,
        f: &Function,
        block: [u32; 3],
        shared_mem: u32,
        cluster: [u32; 3],
    ) -> Result<u32> {
        if self.inner.info.flags & sys::INFO_OCCUPANCY == 0 {
            return Err(Error::Unsupported);
        }
        let r = self.run_one(VgpuCmd::occupancy(sys::VgpuOccupancyArgs {
            module: f.module,
            function: f.handle,
            block,
            shared_mem,
            cluster,
            pad: 0,
        }))?;
        u32::try_from(r.result).map_err(|_| Error::Io)
    }

    /// Whether the device has CUDA arrays, texture and surface objects
    /// (they need the device's contexts too: each process's are its own).
    pub fn has_arrays(&self) -> bool {
        self.inner.info.features & sys::FEATURE_ARRAYS != 0
            && self.inner.info.flags & sys::INFO_CONTEXTS != 0
    }

    /// Runs an ARRAY_CREATE, ARRAY_COPY, OBJECT_CREATE or OBJECT_DESTROY
    /// (built by [`VgpuCmd::array`] and its neighbours) and waits for it;
    /// the result is the handle an ARRAY_CREATE or OBJECT_CREATE made.
    pub fn resource(&self, cmd: VgpuCmd) -> Result<u64> {
        if !self.has_arrays() {
            return Err(Error::Unsupported);
        }
        if !matches!(
            cmd.opcode,
            sys::CMD_ARRAY_CREATE
                | sys::CMD_ARRAY_COPY
                | sys::CMD_OBJECT_CREATE
                | sys::CMD_OBJECT_DESTROY
        ) {
            return Err(Error::Usage(format!(
                "opcode {} is no resource command",
                cmd.opcode
            )));
        }
        Ok(self.run_one(cmd)?.result)
    }

    /// Runs `f` (from [`Device::function`]).
    pub fn launch_function(&self, f: &Function, dims: Dims, params: &[u8]) -> Result<CmdResult> {
        self.run_one(launch_function_cmd(f, dims, params)?)
    }

    /// Loads a module (PTX text). Backends that cannot run loaded modules
    /// answer [`Error::Unsupported`]. The module is unloaded on drop.
    pub fn module_load(&self, image: &[u8]) -> Result<Module> {
        self.module_load_format(sys::MODULE_PTX, image)
    }

    /// Loads a module image of `format` (`sys::MODULE_PTX` or
    /// `sys::MODULE_FATBIN`).
    pub fn module_load_format(&self, format: u32, image: &[u8]) -> Result<Module> {
        if image.is_empty() {
            return Err(Error::Usage("empty module image".into()));
        }
        let r = self.run_one(VgpuCmd::module_load(sys::VgpuModuleLoadArgs {
            format,
            pad: 0,
            image: image.as_ptr() as u64,
            image_size: image.len() as u64,
        }))?;
        Ok(Module {
            dev: self.inner.clone(),
            handle: r.result,
            prints: self.inner.info.flags & sys::INFO_CONSOLE != 0
                && r.result2 & sys::MODULE_PRINTS != 0,
        })
    }

    /// Takes what the kernels of `module` printed (see
    /// [`Module::prints`]), oldest first, in pieces of `piece` bytes (at
    /// most [`sys::MAX_CONSOLE_BYTES`]): the output, and the bytes the
    /// device dropped since the last call because its buffer was full.
    /// Empty when nothing waits. The device writes to this process's
    /// memory, so output printed before a fault that lost the device
    /// state still arrives.
    pub fn console(&self, module: &Module, piece: usize) -> Result<(Vec<u8>, u64)> {
        if self.inner.info.flags & sys::INFO_CONSOLE == 0 {
            return Err(Error::Unsupported);
        }
        let len = piece.min(sys::MAX_CONSOLE_BYTES as usize);
        if len == 0 {
            return Err(Error::Usage("an empty console piece".into()));
        }
        let mut buf = vec![0u8; len];
        let mut out = Vec::new();
        let mut dropped = 0u64;
        loop {
            let r = self.run_one(VgpuCmd::console(sys::VgpuConsoleArgs {
                module: module.handle,
                out: buf.as_mut_ptr() as u64,
                out_size: len as u32,
                pad: 0,
            }))?;
            let n = (r.result as usize).min(len);
            dropped = dropped.saturating_add(r.result2);
            out.extend_from_slice(&buf[..n]);
            // A full piece: more may wait, though never more than the
            // device keeps (kernels still running may add to it).
            if n < len || out.len() >= 2 * sys::MAX_CONSOLE_BYTES as usize {
                return Ok((out, dropped));
            }
        }
    }

    /// Reads the device clock (TIMESTAMP), in nanoseconds.
    pub fn timestamp(&self) -> Result<u64> {
        Ok(self.run_one(VgpuCmd::bare(sys::CMD_TIMESTAMP, 0))?.result)
    }

    /// Waits until every command submitted earlier through this device has
    /// completed (a waited NOP: a file's commands run in order). Results
    /// of [`Pending`] batches are still collected by their owners.
    pub fn synchronize(&self) -> Result<()> {
        self.run_one(VgpuCmd::bare(sys::CMD_NOP, 0)).map(drop)
    }

    /// Runs one command whose pointers (if any) are valid for this call.
    fn run_one(&self, cmd: VgpuCmd) -> Result<CmdResult> {
        let mut cmds = [cmd];
        // SAFETY: the pointers in `cmd` (images, parameter blocks) come
        // from slices the caller borrowed for this call, and `run` returns
        // only after the device is done.
        unsafe { self.inner.run(&mut cmds) }?;
        Ok(CmdResult::from(&cmds[0]))
    }

    /// Submits a batch without waiting. The returned [`Pending`] owns the
    /// batch (and the host memory its copies use) until it completes.
    pub fn submit(&self, batch: Batch) -> Result<Pending> {
        let mut batch = batch;
        batch.take_error()?;
        // SAFETY: the user pointers in the batch point into host memory
        // the batch owns; the batch moves into the `Pending`, which keeps
        // it (never freeing it early, see `Pending`'s drop) until the
        // fence is collected.
        let fence = unsafe { self.inner.submit(batch.cmds_mut()) }?;
        Ok(Pending::new(self.inner.clone(), fence, batch))
    }

    /// Submits a batch, waits for it and fails on its first failed command.
    pub fn run(&self, batch: Batch) -> Result<Completed> {
        let mut p = self.submit(batch)?;
        let done = loop {
            match p.wait(None) {
                Err(Error::Interrupted) => continue,
                r => break r?,
            }
        };
        done.check()?;
        Ok(done)
    }

    /// Maps the whole host-visible window (BAR2) with `MAP_SHARED`.
    pub fn map_window(&self) -> Result<Window> {
        let len = self.inner.info.window_size;
        if len == 0 || self.inner.info.flags & sys::INFO_WINDOW == 0 {
            return Err(Error::Unsupported);
        }
        self.map_window_range(0, len)
    }

    /// Maps `len` bytes of the window from `offset` (both page multiples).
    pub fn map_window_range(&self, offset: u64, len: u64) -> Result<Window> {
        let size = usize::try_from(len).map_err(|_| Error::Invalid)?;
        let off = libc::off_t::try_from(offset).map_err(|_| Error::Invalid)?;
        if size == 0 {
            return Err(Error::Invalid);
        }
        // SAFETY: a fresh mapping chosen by the kernel (no address hint),
        // so it replaces nothing; the result is checked below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.inner.file.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os_error());
        }
        let ptr = NonNull::new(ptr as *mut u8).ok_or(Error::Fault)?;
        Ok(Window {
            ptr,
            len: size,
            offset,
            _dev: self.inner.clone(),
        })
    }

    /// Issues an arbitrary ioctl on the device file and returns its
    /// result. For tests of the driver's argument checks.
    ///
    /// # Safety
    ///
    /// `arg` is passed to the driver as is: whatever `req` encodes, the
    /// driver may read or write that many bytes there, and follow the
    /// pointers inside. The caller must make that harmless.
    pub unsafe fn ioctl_raw(&self, req: u64, arg: *mut libc::c_void) -> Result<()> {
        // SAFETY: the caller's contract.
        let rc = unsafe { libc::ioctl(self.as_raw_fd(), req as libc::Ioctl, arg) };
        if rc < 0 {
            Err(Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Runs raw commands as one batch and waits for it.
    ///
    /// # Safety
    ///
    /// Every user pointer in `cmds` (COPY user sides, images, parameter
    /// blocks) must be valid for the device's accesses until this returns.
    pub unsafe fn run_raw(&self, cmds: &mut [VgpuCmd]) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.inner.run(cmds) }
    }
}

impl AsRawFd for Device {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.file.as_raw_fd()
    }
}

/// The host-visible window (BAR2) mapped into this process. It is shared
/// by every process of the guest that maps it and by the host, so it is
/// only accessed through volatile copies, never through references.
pub struct Window {
    ptr: NonNull<u8>,
    len: usize,
    offset: u64,
    _dev: Arc<Inner>,
}

// SAFETY: the mapping is plain shared memory owned by this value; every
// access is a volatile read or write through the raw pointer (no
// references), which is how memory shared with other processes is used.
unsafe impl Send for Window {}
// SAFETY: as above; `&Window` methods only do volatile accesses.
unsafe impl Sync for Window {}

impl std::fmt::Debug for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl Window {
    /// Mapped bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true (a mapping has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Window offset of the first mapped byte.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The mapping (for volatile accesses only).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Bounds {
                what: "window",
                offset: offset as u64,
                len: len as u64,
                size: self.len as u64,
            }),
        }
    }

    /// Copies `out.len()` bytes from `offset` of the mapping.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check(offset, out.len())?;
        let base = self.ptr.as_ptr();
        let mut i = 0;
        while i < out.len() && !(offset + i).is_multiple_of(8) {
            // SAFETY: offset + i < offset + out.len() <= len (checked), so
            // inside the mapping.
            out[i] = unsafe { base.add(offset + i).read_volatile() };
            i += 1;
        }
        while i + 8 <= out.len() {
            // SAFETY: offset + i is 8-byte aligned (the mapping is page
            // aligned) and the 8 bytes are inside the mapping.
            let w = unsafe { (base.add(offset + i) as *const u64).read_volatile() };
            out[i..i + 8].copy_from_slice(&w.to_ne_bytes());
            i += 8;
        }
        while i < out.len() {
            // SAFETY: inside the mapping, as above.
            out[i] = unsafe { base.add(offset + i).read_volatile() };
            i += 1;
        }
        Ok(())
    }

    /// Copies `data` to `offset` of the mapping.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.check(offset, data.len())?;
        let base = self.ptr.as_ptr();
        let mut i = 0;
        while i < data.len() && !(offset + i).is_multiple_of(8) {
            // SAFETY: inside the mapping (checked above).
            unsafe { base.add(offset + i).write_volatile(data[i]) };
            i += 1;
        }
        while i + 8 <= data.len() {
            let w = u64::from_ne_bytes(data[i..i + 8].try_into().unwrap_or_default());
            // SAFETY: 8-byte aligned and inside the mapping.
            unsafe { (base.add(offset + i) as *mut u64).write_volatile(w) };
            i += 8;
        }
        while i < data.len() {
            // SAFETY: inside the mapping.
            unsafe { base.add(offset + i).write_volatile(data[i]) };
            i += 1;
        }
        Ok(())
    }

    /// Reads the 32-bit word at `offset` (a multiple of 4).
    pub fn read_u32(&self, offset: usize) -> Result<u32> {
        self.check(offset, 4)?;
        if !offset.is_multiple_of(4) {
            return Err(Error::Usage(format!("unaligned window offset {offset:#x}")));
        }
        // SAFETY: aligned and inside the mapping.
        Ok(unsafe { (self.ptr.as_ptr().add(offset) as *const u32).read_volatile() })
    }

    /// Writes the 32-bit word at `offset` (a multiple of 4).
    pub fn write_u32(&self, offset: usize, value: u32) -> Result<()> {
        self.check(offset, 4)?;
        if !offset.is_multiple_of(4) {
            return Err(Error::Usage(format!("unaligned window offset {offset:#x}")));
        }
        // SAFETY: aligned and inside the mapping.
        unsafe { (self.ptr.as_ptr().add(offset) as *mut u32).write_volatile(value) };
        Ok(())
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value created and owns;
        // no references into it exist.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_open_reports_missing_file_and_non_vgpu_files() {
        match Device::open("/nonexistent/vgpu0") {
            Err(Error::Open { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
        // A file that is not a vgpu device: INFO is refused.
        match Device::open("/dev/null") {
            Err(e) => assert_eq!(e.errno(), libc::ENOTTY),
            Ok(d) => panic!("/dev/null opened as {d:?}"),
        }
    }
}
