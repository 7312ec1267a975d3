//! Convenience calls: one command, submitted and waited for.

use vgpu_abi::{self as abi, ByteValued, CmdHeader, Completion, CopyCmd, LaunchCmd, SgEntry};

use crate::guest::Guest;
use crate::ring::Chain;

fn hdr(opcode: u32, flags: u32) -> CmdHeader {
    CmdHeader { opcode, flags }
}

/// A LAUNCH of `entry` in the built-in module with a `params_size`-byte
/// parameter block; panics if the name does not fit.
pub fn launch_cmd(entry: &str, grid: [u32; 3], block: [u32; 3], params_size: u32) -> LaunchCmd {
    LaunchCmd {
        hdr: hdr(abi::OP_LAUNCH, 0),
        module: abi::MODULE_BUILTIN,
        grid,
        block,
        shared_mem: 0,
        params_size,
        entry: abi::entry_name(entry).unwrap_or_else(|| panic!("entry name {entry:?} too long")),
    }
}

/// A COPY of `size` bytes from `src` (a place of kind `src_kind`) to `dst`
/// (of kind `dst_kind`), with a guest side's list of `sg_count` entries.
pub fn copy_cmd(
    src_kind: u32,
    dst_kind: u32,
    src: u64,
    dst: u64,
    size: u64,
    sg_count: u32,
) -> CopyCmd {
    CopyCmd {
        hdr: hdr(abi::OP_COPY, 0),
        src_kind,
        dst_kind,
        src,
        dst,
        size,
        sg_count,
        reserved: 0,
    }
}

/// Little-endian bytes of `v`.
pub fn f32s_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Floats of little-endian `bytes` (a multiple of 4).
pub fn bytes_to_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The chain of a COPY between device address `dev` and the guest
/// buffers of `sg` (into the device when `to_device`), with its
/// completion, for batches.
pub fn guest_copy_chain(to_device: bool, dev: u64, sg: &[SgEntry]) -> Chain {
    let size = sg.iter().map(|e| e.len).sum();
    let (guest, device) = ((abi::COPY_GUEST, 0), (abi::COPY_DEVICE, dev));
    let (src, dst) = if to_device {
        (guest, device)
    } else {
        (device, guest)
    };
    let cmd = copy_cmd(src.0, dst.0, src.1, dst.1, size, sg.len() as u32);
    Chain::command(&cmd).bytes(&sg_bytes(sg)).completion()
}

/// The chain of a FILL of `size` bytes at `addr` with `pattern`, with its
/// completion, for batches.
pub fn fill_chain(addr: u64, size: u64, pattern: u32) -> Chain {
    let cmd = abi::FillCmd {
        hdr: hdr(abi::OP_FILL, 0),
        addr,
        size,
        pattern,
        reserved: 0,
    };
    Chain::command(&cmd).completion()
}

/// The chain of a WRITE_VALUE (`OP_WRITE_VALUE`) or WAIT_VALUE
/// (`OP_WAIT_VALUE`) of the word at guest address `addr`, with its
/// completion.
pub fn value_chain(opcode: u32, flags: u32, addr: u64, value: u64) -> Chain {
    let cmd = abi::ValueCmd {
        hdr: hdr(opcode, flags),
        addr,
        value,
    };
    Chain::command(&cmd).completion()
}

/// The chain of a command that is only its header (a TIMESTAMP, a NOP),
/// with its completion, for batches.
pub fn bare_chain(opcode: u32) -> Chain {
    Chain::command(&hdr(opcode, 0)).completion()
}

fn sg_bytes(sg: &[SgEntry]) -> Vec<u8> {
    sg.iter().flat_map(|e| e.as_slice().to_vec()).collect()
}

impl Guest {
    /// Submits `chain` on queue `q` and returns its completion.
    pub fn run(&mut self, q: u32, chain: &Chain) -> Completion {
        self.submit(q, chain).completion()
    }

    /// Submits command `cmd` with no data descriptors.
    pub fn run_cmd<T: ByteValued>(&mut self, q: u32, cmd: &T) -> Completion {
        self.run(q, &Chain::command(cmd).completion())
    }

    /// NOP.
    pub fn nop(&mut self, q: u32) -> Completion {
        self.run_cmd(q, &hdr(abi::OP_NOP, 0))
    }

    /// TIMESTAMP; the result is the device time in nanoseconds.
    pub fn timestamp(&mut self, q: u32) -> Completion {
        self.run_cmd(q, &hdr(abi::OP_TIMESTAMP, 0))
    }

    /// FENCE writing `value` at guest address `addr`.
    pub fn fence(&mut self, q: u32, addr: u64, value: u64, flags: u32) -> Completion {
        self.run_cmd(
            q,
            &abi::FenceCmd {
                hdr: hdr(abi::OP_FENCE, flags),
                addr,
                value,
            },
        )
    }

    /// MEM_ALLOC; the result is the device address.
    pub fn mem_alloc(&mut self, q: u32, size: u64, align: u64) -> Completion {
        self.run_cmd(
            q,
            &abi::MemAllocCmd {
                hdr: hdr(abi::OP_MEM_ALLOC, 0),
                size,
                align,
            },
        )
    }

    /// MEM_FREE.
    pub fn mem_free(&mut self, q: u32, addr: u64) -> Completion {
        self.run_cmd(
            q,
            &abi::MemFreeCmd {
                hdr: hdr(abi::OP_MEM_FREE, 0),
                addr,
            },
        )
    }

    /// Allocates `size` bytes of device memory; panics unless it succeeds.
    pub fn device_alloc(&mut self, q: u32, size: u64) -> u64 {
        let c = self.mem_alloc(q, size, 0);
        assert_eq!(c.status, abi::STATUS_OK, "MEM_ALLOC of {size} bytes");
        c.result
    }

    /// COPY `cmd`, with `sg` as the guest scatter-gather list descriptor
    /// when given (its `sg_count` is taken as set in `cmd`).
    pub fn copy(&mut self, q: u32, cmd: &CopyCmd, sg: Option<&[SgEntry]>) -> Completion {
        let mut chain = Chain::command(cmd);
        if let Some(sg) = sg {
            chain = chain.bytes(&sg_bytes(sg));
        }
        self.run(q, &chain.completion())
    }

    /// COPY between device address `dev` and the guest buffers of `sg`:
    /// into the device when `to_device`, out of it otherwise.
    fn copy_guest(&mut self, q: u32, to_device: bool, dev: u64, sg: &[SgEntry]) -> Completion {
        self.run(q, &guest_copy_chain(to_device, dev, sg))
    }

    /// COPY guest -> device of the bytes of `sg` to device address `dst`.
    pub fn copy_to_device(&mut self, q: u32, dst: u64, sg: &[SgEntry]) -> Completion {
        self.copy_guest(q, true, dst, sg)
    }

    /// COPY device -> guest from device address `src` into `sg`.
    pub fn copy_from_device(&mut self, q: u32, src: u64, sg: &[SgEntry]) -> Completion {
        self.copy_guest(q, false, src, sg)
    }

    /// COPY window -> device.
    pub fn copy_window_to_device(
        &mut self,
        q: u32,
        window_off: u64,
        dst: u64,
        size: u64,
    ) -> Completion {
        self.copy_kinds(
            q,
            (abi::COPY_WINDOW, abi::COPY_DEVICE),
            window_off,
            dst,
            size,
        )
    }

    /// COPY device -> window.
    pub fn copy_device_to_window(
        &mut self,
        q: u32,
        src: u64,
        window_off: u64,
        size: u64,
    ) -> Completion {
        self.copy_kinds(
            q,
            (abi::COPY_DEVICE, abi::COPY_WINDOW),
            src,
            window_off,
            size,
        )
    }

    /// COPY device -> device.
    pub fn copy_device_to_device(&mut self, q: u32, dst: u64, src: u64, size: u64) -> Completion {
        self.copy_kinds(q, (abi::COPY_DEVICE, abi::COPY_DEVICE), src, dst, size)
    }

    /// A COPY without guest memory, between the (source, destination)
    /// memory kinds `kinds`.
    fn copy_kinds(
        &mut self,
        q: u32,
        kinds: (u32, u32),
        src: u64,
        dst: u64,
        size: u64,
    ) -> Completion {
        let cmd = copy_cmd(kinds.0, kinds.1, src, dst, size, 0);
        self.copy(q, &cmd, None)
    }

    /// Copies `data` to device address `dst` through a staged guest
    /// buffer; panics unless it succeeds.
    pub fn upload(&mut self, q: u32, dst: u64, data: &[u8]) {
        let addr = self.stage(data);
        let sg = [SgEntry {
            addr,
            len: data.len() as u64,
        }];
        let c = self.copy_to_device(q, dst, &sg);
        assert_eq!(
            c.status,
            abi::STATUS_OK,
            "upload of {} bytes to {dst:#x}",
            data.len()
        );
    }

    /// Reads `len` bytes at device address `src` through a staged guest
    /// buffer; panics unless it succeeds.
    pub fn download(&mut self, q: u32, src: u64, len: usize) -> Vec<u8> {
        let addr = self.stage_len(len as u64);
        let sg = [SgEntry {
            addr,
            len: len as u64,
        }];
        let c = self.copy_from_device(q, src, &sg);
        assert_eq!(
            c.status,
            abi::STATUS_OK,
            "download of {len} bytes from {src:#x}"
        );
        self.read(addr, len)
    }

    /// FILL `size` bytes at `addr` with `pattern`.
    pub fn fill(&mut self, q: u32, addr: u64, size: u64, pattern: u32) -> Completion {
        self.run_cmd(
            q,
            &abi::FillCmd {
                hdr: hdr(abi::OP_FILL, 0),
                addr,
                size,
                pattern,
                reserved: 0,
            },
        )
    }

    /// MODULE_LOAD of `image`; the result is the module handle.
    pub fn module_load(&mut self, q: u32, format: u32, image: &[u8]) -> Completion {
        let cmd = abi::ModuleLoadCmd {
            hdr: hdr(abi::OP_MODULE_LOAD, 0),
            format,
            reserved: 0,
            image_size: image.len() as u64,
        };
        self.run(q, &Chain::command(&cmd).bytes(image).completion())
    }

    /// MODULE_UNLOAD.
    pub fn module_unload(&mut self, q: u32, module: u64) -> Completion {
        self.run_cmd(
            q,
            &abi::ModuleUnloadCmd {
                hdr: hdr(abi::OP_MODULE_UNLOAD, 0),
                module,
            },
        )
    }

    /// LAUNCH of built-in `entry` with parameter block `params`, on one
    /// block of 256 threads.
    pub fn launch<P: ByteValued>(&mut self, q: u32, entry: &str, params: &P) -> Completion {
        let cmd = launch_cmd(
            entry,
            [1, 1, 1],
            [256, 1, 1],
            std::mem::size_of::<P>() as u32,
        );
        self.launch_raw(q, &cmd, params.as_slice())
    }

    /// FUNC_INFO of `entry` in `module`, the description written to
    /// device memory at `out` (`out_size` bytes); the result is the
    /// function handle.
    pub fn func_info(
        &mut self,
        q: u32,
        module: u64,
        entry: &str,
        out: u64,
        out_size: u32,
    ) -> Completion {
        let cmd = abi::FuncInfoCmd {
            hdr: hdr(abi::OP_FUNC_INFO, 0),
            module,
            out,
            out_size,
            name_len: entry.len() as u32,
        };
        self.run(
            q,
            &Chain::command(&cmd).bytes(entry.as_bytes()).completion(),
        )
    }

    /// LAUNCH `cmd` with `params` as the parameter descriptor (sent as
    /// given, whatever `cmd.params_size` says).
    pub fn launch_raw(&mut self, q: u32, cmd: &LaunchCmd, params: &[u8]) -> Completion {
        self.run(q, &Chain::command(cmd).bytes(params).completion())
    }
}
