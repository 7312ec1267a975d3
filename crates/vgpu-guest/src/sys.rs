//! The user interface of the vgpu guest driver, mirrored from
//! `guest-driver/include/uapi/vgpu.h`: constants, `#[repr(C)]` structures
//! and ioctl numbers.
//!
//! A unit test compiles a C program against the header and compares every
//! size, offset, constant and ioctl number with the definitions here.
//! `guest-driver/README.md` documents the semantics.

#![allow(missing_docs)]

use std::mem::size_of;

/// `VGPU_UAPI_VERSION`.
pub const UAPI_VERSION: u32 = 1;

/// Commands per SUBMIT.
pub const MAX_BATCH_CMDS: u32 = 256;
/// Bytes per COPY with a user side.
pub const MAX_COPY_BYTES: u64 = 64 << 20;
/// User memory pinned per SUBMIT.
pub const MAX_BATCH_PIN_BYTES: u64 = 256 << 20;
/// Images and parameters staged per SUBMIT.
pub const MAX_BATCH_STAGED_BYTES: u64 = 32 << 20;
/// Uncollected fences per open file.
pub const MAX_UNCOLLECTED: u32 = 1024;
/// Bytes of a LAUNCH entry name, NUL included.
pub const ENTRY_NAME_LEN: usize = 32;
/// PIN ranges per open file.
pub const MAX_PINNED_RANGES: u32 = 256;

/// `timeout_ns` that never expires.
pub const TIMEOUT_INFINITE: u64 = !0;

/// `vgpu_info.flags`: queues are polled by the device.
pub const INFO_POLLED: u32 = 1 << 0;
/// `vgpu_info.flags`: MSI-X interrupts (else INTx).
pub const INFO_MSIX: u32 = 1 << 1;
/// `vgpu_info.flags`: the window can be mmap()ed.
pub const INFO_WINDOW: u32 = 1 << 2;
/// `vgpu_info.flags`: FUNC_INFO and launches by function handle.
pub const INFO_FUNC_INFO: u32 = 1 << 3;
/// `vgpu_info.flags`: OCCUPANCY.
pub const INFO_OCCUPANCY: u32 = 1 << 4;
/// `vgpu_info.flags`: CONSOLE, and MODULE_LOAD says which modules print.
pub const INFO_CONSOLE: u32 = 1 << 5;
/// `vgpu_info.flags`: a device context per open file, so a kernel's
/// fault ends that file's work only (`vgpu_info.max_contexts` at once).
pub const INFO_CONTEXTS: u32 = 1 << 6;
/// `vgpu_info.flags`: virtual memory management (VGPU_IOCTL_VMM).
pub const INFO_VMM: u32 = 1 << 7;

// Opcodes, the flags of LAUNCH and FUNC_INFO, the module formats, the
// built-in module and the result statuses are the device's: the driver
// passes them through (it asserts each equality), so they are vgpu-abi's.
/// Device FEATURES bit: CUDA arrays, texture and surface objects.
pub use vgpu_abi::FEATURE_ARRAYS;
/// Device FEATURES bit: cooperative launches.
pub use vgpu_abi::FEATURE_COOPERATIVE;
/// Device FEATURES bit: WRITE_VALUE and WAIT_VALUE.
pub use vgpu_abi::FEATURE_VALUES;
pub use vgpu_abi::{
    ARRAY_COPY_DST_ARRAY as CMD_COPY_DST_ARRAY, ARRAY_COPY_SRC_ARRAY as CMD_COPY_SRC_ARRAY,
    ARRAY_FLAG_CUBEMAP as CMD_ARRAY_CUBEMAP, ARRAY_FLAG_LAYERED as CMD_ARRAY_LAYERED,
    ARRAY_FLAG_SURFACE as CMD_ARRAY_SURFACE, OBJECT_ARRAY as OBJ_ARRAY,
    OBJECT_SURFACE as OBJ_SURFACE, OBJECT_TEXTURE as OBJ_TEXTURE, OP_ARRAY_COPY as CMD_ARRAY_COPY,
    OP_ARRAY_CREATE as CMD_ARRAY_CREATE, OP_OBJECT_CREATE as CMD_OBJECT_CREATE,
    OP_OBJECT_DESTROY as CMD_OBJECT_DESTROY,
};
pub use vgpu_abi::{
    FUNC_INFO_FLAG_GLOBAL as CMD_FUNC_INFO_GLOBAL,
    LAUNCH_FLAG_COOPERATIVE as CMD_LAUNCH_COOPERATIVE, LAUNCH_FLAG_FUNCTION as CMD_LAUNCH_FUNCTION,
    MODULE_BUILTIN as MODULE_BUILTIN_ID, MODULE_FORMAT_CUBIN as MODULE_CUBIN,
    MODULE_FORMAT_FATBIN as MODULE_FATBIN, MODULE_FORMAT_PTX as MODULE_PTX,
    OP_CONSOLE as CMD_CONSOLE, OP_COPY as CMD_COPY, OP_FENCE as CMD_FENCE, OP_FILL as CMD_FILL,
    OP_FUNC_INFO as CMD_FUNC_INFO, OP_LAUNCH as CMD_LAUNCH, OP_MODULE_LOAD as CMD_MODULE_LOAD,
    OP_MODULE_UNLOAD as CMD_MODULE_UNLOAD, OP_NOP as CMD_NOP, OP_OCCUPANCY as CMD_OCCUPANCY,
    OP_TIMESTAMP as CMD_TIMESTAMP, OP_WAIT_VALUE as CMD_WAIT_VALUE,
    OP_WRITE_VALUE as CMD_WRITE_VALUE, STATUS_CANCELLED as CMD_STATUS_CANCELLED,
    STATUS_CONTEXT_LOST as CMD_STATUS_CONTEXT_LOST, STATUS_DEVICE_ERROR as CMD_STATUS_DEVICE_ERROR,
    STATUS_FAULT as CMD_STATUS_FAULT, STATUS_INVALID as CMD_STATUS_INVALID,
    STATUS_KERNEL_ASSERT as CMD_STATUS_KERNEL_ASSERT,
    STATUS_KERNEL_FAULT as CMD_STATUS_KERNEL_FAULT, STATUS_NOT_FOUND as CMD_STATUS_NOT_FOUND,
    STATUS_NO_MEMORY as CMD_STATUS_NO_MEMORY, STATUS_OK as CMD_STATUS_OK,
    STATUS_OUT_OF_RANGE as CMD_STATUS_OUT_OF_RANGE, STATUS_UNSUPPORTED as CMD_STATUS_UNSUPPORTED,
    VALUE_FLAG_32 as CMD_VALUE_32, WAIT_AND as CMD_WAIT_AND, WAIT_EQ as CMD_WAIT_EQ,
    WAIT_GEQ as CMD_WAIT_GEQ, WAIT_NOR as CMD_WAIT_NOR,
};
// The limits the driver asserts equal to the device's.
pub use vgpu_abi::{
    CONSOLE_BYTES as MAX_CONSOLE_BYTES, MAX_ENTRY_NAME as MAX_FUNC_NAME_BYTES,
    MAX_MODULE_SIZE as MAX_IMAGE_BYTES, MAX_PARAMS_SIZE as MAX_PARAMS_BYTES,
    MODULE_FLAG_PRINTS as MODULE_PRINTS,
};

/// `vgpu_cmd.flags` of a FENCE: raise the queue's interrupt.
pub const CMD_FENCE_IRQ: u32 = 1 << 0;

/// COPY side: memory of the calling process (a user address).
pub const MEM_USER: u32 = 0;
/// COPY side: device memory (an address from ALLOC).
pub const MEM_DEVICE: u32 = 1;
/// COPY side: the window (a byte offset).
pub const MEM_WINDOW: u32 = 2;

/// SUBMIT flag: wait for the batch, write the results and collect it.
pub const SUBMIT_WAIT: u32 = 1 << 0;
/// "No command" in `error_index`.
pub const NO_INDEX: u32 = 0xffff_ffff;
/// WAIT flag: also collect every earlier fence.
pub const WAIT_ALL: u32 = 1 << 0;

/// `VGPU_IOCTL_MAGIC`.
pub const IOCTL_MAGIC: u8 = b'V';

macro_rules! uapi_struct {
    ($(#[$m:meta])* pub struct $name:ident => $cname:literal {
        $( $(#[$fm:meta])* pub $field:ident : $ty:ty ),* $(,)?
    }) => {
        $(#[$m])*
        #[doc = concat!("\n\nC: `struct ", $cname, "`.")]
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name { $( $(#[$fm])* pub $field: $ty ),* }

        // Explicit padding everywhere: the fields fill the structure.
        const _: () = assert!(size_of::<$name>() == 0 $(+ size_of::<$ty>())*);

        #[cfg(test)]
        impl $name {
            pub(crate) const C_NAME: &'static str = $cname;
            /// (C member, offset, size) of every field.
            pub(crate) fn c_fields() -> Vec<(&'static str, usize, usize)> {
                vec![$( (stringify!($field), std::mem::offset_of!($name, $field), size_of::<$ty>()) ),*]
            }
        }
    };
}

uapi_struct!(
    /// VGPU_IOCTL_INFO: identity of the function and the driver's setup.
    pub struct VgpuInfo => "vgpu_info" {
        pub uapi_version: u32,
        /// Device VERSION register: `major << 16 | minor`.
        pub abi_version: u32,
        pub vendor_id: u16,
        pub device_id: u16,
        pub subsystem_vendor_id: u16,
        pub subsystem_id: u16,
        pub revision: u8,
        pub pci_bus: u8,
        pub pci_devfn: u8,
        pub pad0: u8,
        pub pci_domain: u32,
        /// Device FEATURES register.
        pub features: u64,
        /// Device memory of the partition, bytes.
        pub mem_size: u64,
        /// Host-visible window (BAR2), bytes.
        pub window_size: u64,
        pub compute_units: u32,
        pub max_queues: u32,
        pub queues: u32,
        pub queue_size: u32,
        /// `INFO_*`.
        pub flags: u32,
        /// N of `/dev/vgpuN`.
        pub minor: u32,
        /// With [`INFO_CONTEXTS`], the contexts the function may have at
        /// once.
        pub max_contexts: u32,
        pub pad1: u32,
        /// Device memory each context holds of its own while it lives.
        pub context_cost: u64,
        pub reserved: [u64; 2],
    }
);

impl VgpuInfo {
    /// The interrupts the driver set up: `"MSI-X"` or `"INTx"`.
    pub fn irq_kind(&self) -> &'static str {
        if self.flags & INFO_MSIX != 0 {
            "MSI-X"
        } else {
            "INTx"
        }
    }

    /// Whether the device polls the queues.
    pub fn polled(&self) -> bool {
        self.flags & INFO_POLLED != 0
    }

    /// A stable UUID for the function, from what identifies it: its PCI
    /// location and identity. CUDA (`cuDeviceGetUuid`) and NVML
    /// (`nvmlDeviceGetUUID`) report these same bytes.
    pub fn uuid(&self) -> [u8; 16] {
        let mut u = [0u8; 16];
        u[..4].copy_from_slice(b"VGPU");
        u[4..8].copy_from_slice(&self.pci_domain.to_le_bytes());
        u[8] = self.pci_bus;
        u[9] = self.pci_devfn;
        u[10..12].copy_from_slice(&self.vendor_id.to_le_bytes());
        u[12..14].copy_from_slice(&self.device_id.to_le_bytes());
        u[14..16].copy_from_slice(&self.subsystem_id.to_le_bytes());
        u
    }
}

uapi_struct!(
    /// VGPU_IOCTL_ALLOC.
    pub struct VgpuAlloc => "vgpu_alloc" {
        pub size: u64,
        pub align: u64,
        pub addr: u64,
        pub flags: u32,
        pub pad: u32,
    }
);

uapi_struct!(
    /// VGPU_IOCTL_FREE.
    pub struct VgpuFree => "vgpu_free" {
        pub addr: u64,
    }
);

uapi_struct!(
    /// Arguments of a COPY.
    pub struct VgpuCopyArgs => "vgpu_copy_args" {
        pub src_kind: u32,
        pub dst_kind: u32,
        pub src: u64,
        pub dst: u64,
        pub size: u64,
    }
);

uapi_struct!(
    /// Arguments of a FILL.
    pub struct VgpuFillArgs => "vgpu_fill_args" {
        pub addr: u64,
        pub size: u64,
        pub pattern: u32,
        pub pad: u32,
    }
);

uapi_struct!(
    /// Arguments of a MODULE_LOAD.
    pub struct VgpuModuleLoadArgs => "vgpu_module_load_args" {
        pub format: u32,
        pub pad: u32,
        pub image: u64,
        pub image_size: u64,
    }
);

uapi_struct!(
    /// Arguments of a MODULE_UNLOAD.
    pub struct VgpuModuleUnloadArgs => "vgpu_module_unload_args" {
        pub module: u64,
    }
);

uapi_struct!(
    /// Arguments of a LAUNCH.
    pub struct VgpuLaunchArgs => "vgpu_launch_args" {
        pub module: u64,
        pub grid: [u32; 3],
        pub block: [u32; 3],
        pub shared_mem: u32,
        pub params_size: u32,
        pub params: u64,
        pub entry: [u8; ENTRY_NAME_LEN],
    }
);

uapi_struct!(
    /// Arguments of a FUNC_INFO.
    pub struct VgpuFuncInfoArgs => "vgpu_func_info_args" {
        pub module: u64,
        /// Device address the description goes to.
        pub out: u64,
        pub out_size: u32,
        pub name_len: u32,
        /// User pointer to the name.
        pub name: u64,
    }
);

uapi_struct!(
    /// Arguments of an OCCUPANCY.
    pub struct VgpuOccupancyArgs => "vgpu_occupancy_args" {
        pub module: u64,
        /// Function handle from FUNC_INFO of `module`.
        pub function: u64,
        pub block: [u32; 3],
        pub shared_mem: u32,
        pub cluster: [u32; 3],
        pub pad: u32,
    }
);

uapi_struct!(
    /// Arguments of a CONSOLE.
    pub struct VgpuConsoleArgs => "vgpu_console_args" {
        pub module: u64,
        /// User pointer the output goes to.
        pub out: u64,
        pub out_size: u32,
        pub pad: u32,
    }
);

uapi_struct!(
    /// Arguments of a WRITE_VALUE or WAIT_VALUE.
    pub struct VgpuValueArgs => "vgpu_value_args" {
        /// User address of the word, inside a pinned range.
        pub addr: u64,
        pub value: u64,
    }
);

uapi_struct!(
    /// Arguments of an ARRAY_CREATE (the device's command after its
    /// header).
    pub struct VgpuArrayArgs => "vgpu_array_args" {
        /// `CUarray_format` number.
        pub format: u32,
        pub channels: u32,
        pub width: u64,
        pub height: u64,
        pub depth: u64,
    }
);

uapi_struct!(
    /// Arguments of an ARRAY_COPY.
    pub struct VgpuArrayCopyArgs => "vgpu_array_copy_args" {
        pub src: u64,
        pub dst: u64,
        pub src_pitch: u32,
        pub src_height: u32,
        pub dst_pitch: u32,
        pub dst_height: u32,
        pub src_pos: [u32; 3],
        pub dst_pos: [u32; 3],
        pub extent: [u32; 3],
        pub pad: u32,
    }
);

uapi_struct!(
    /// Arguments of an OBJECT_CREATE.
    pub struct VgpuObjectArgs => "vgpu_object_args" {
        pub resource: u64,
        pub size: u64,
        pub res_type: u32,
        pub format: u32,
        pub channels: u32,
        pub width: u32,
        pub height: u32,
        pub address: u32,
        pub filter: u32,
        pub tex_flags: u32,
        /// IEEE single bits.
        pub border: [u32; 4],
    }
);

uapi_struct!(
    /// Arguments of an OBJECT_DESTROY.
    pub struct VgpuObjectDestroyArgs => "vgpu_object_destroy_args" {
        pub handle: u64,
    }
);

uapi_struct!(
    /// VGPU_IOCTL_LANE.
    pub struct VgpuLane => "vgpu_lane" {
        /// An open file of the same function, itself no lane.
        pub fd: i32,
        /// Out: the queue the lane's commands go to.
        pub queue: u32,
    }
);

/// VGPU_IOCTL_VMM: reserve device addresses.
pub const VMM_RESERVE: u32 = 0;
/// VGPU_IOCTL_VMM: free a reservation.
pub const VMM_FREE: u32 = 1;
/// VGPU_IOCTL_VMM: make a physical allocation.
pub const VMM_CREATE: u32 = 2;
/// VGPU_IOCTL_VMM: release a physical allocation.
pub const VMM_RELEASE: u32 = 3;
/// VGPU_IOCTL_VMM: map a physical allocation.
pub const VMM_MAP: u32 = 4;
/// VGPU_IOCTL_VMM: unmap whole mappings.
pub const VMM_UNMAP: u32 = 5;
/// VGPU_IOCTL_VMM: set the access of whole mappings.
pub const VMM_ACCESS: u32 = 6;
/// A mapping's access: none.
pub const VMM_ACCESS_NONE: u32 = 0;
/// A mapping's access: read.
pub const VMM_ACCESS_READ: u32 = 1;
/// A mapping's access: read and write.
pub const VMM_ACCESS_RW: u32 = 3;
/// What VMM addresses, sizes and offsets are multiples of.
pub const VMM_GRANULE: u64 = 2 << 20;

uapi_struct!(
    /// VGPU_IOCTL_VMM: one virtual memory operation.
    pub struct VgpuVmm => "vgpu_vmm" {
        /// `VMM_*`.
        pub op: u32,
        /// ACCESS: `VMM_ACCESS_*`.
        pub access: u32,
        /// In: the address wanted or named; out (RESERVE): the range's.
        pub addr: u64,
        pub size: u64,
        /// RESERVE: 0 or a power of two.
        pub align: u64,
        /// In (RELEASE, MAP) or out (CREATE): a physical allocation.
        pub handle: u64,
        /// MAP: where in `handle` the mapping starts.
        pub offset: u64,
    }
);

/// The argument union of [`VgpuCmd`]. Builders start from `raw` zeroed and
/// write one member, so the bytes past that member stay zero as the driver
/// requires.
#[repr(C)]
#[derive(Clone, Copy)]
pub union VgpuCmdArgs {
    pub copy: VgpuCopyArgs,
    pub fill: VgpuFillArgs,
    pub module_load: VgpuModuleLoadArgs,
    pub module_unload: VgpuModuleUnloadArgs,
    pub launch: VgpuLaunchArgs,
    pub func_info: VgpuFuncInfoArgs,
    pub occupancy: VgpuOccupancyArgs,
    pub console: VgpuConsoleArgs,
    pub value: VgpuValueArgs,
    pub array: VgpuArrayArgs,
    pub array_copy: VgpuArrayCopyArgs,
    pub object: VgpuObjectArgs,
    pub object_destroy: VgpuObjectDestroyArgs,
    pub raw: [u64; 11],
}

impl Default for VgpuCmdArgs {
    fn default() -> Self {
        VgpuCmdArgs { raw: [0; 11] }
    }
}

impl VgpuCmdArgs {
    /// The argument bytes as words.
    pub fn raw(&self) -> [u64; 11] {
        // SAFETY: every member is plain integers with no padding, every
        // value is built from the fully initialised `raw` member (see
        // `Default`), so all 88 bytes are initialised and any bit pattern
        // is a valid `[u64; 11]`.
        unsafe { self.raw }
    }
}

impl std::fmt::Debug for VgpuCmdArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("VgpuCmdArgs").field(&self.raw()).finish()
    }
}

/// One command of a SUBMIT (`struct vgpu_cmd`, 128 bytes). The driver
/// writes the result fields (`status` and after) on completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VgpuCmd {
    pub opcode: u32,
    pub flags: u32,
    pub args: VgpuCmdArgs,
    pub status: u32,
    pub error: i32,
    pub result: u64,
    pub device_ns: u64,
    /// FUNC_INFO of a global: its size.
    pub result2: u64,
}

const _: () = assert!(size_of::<VgpuCmdArgs>() == 88);
const _: () = assert!(size_of::<VgpuCmd>() == 128);

#[cfg(test)]
impl VgpuCmd {
    pub(crate) const C_NAME: &'static str = "vgpu_cmd";
    /// (C member, offset, size); the anonymous union's members all start
    /// at `args`.
    pub(crate) fn c_fields() -> Vec<(&'static str, usize, usize)> {
        use std::mem::offset_of;
        let args = offset_of!(VgpuCmd, args);
        vec![
            ("opcode", offset_of!(VgpuCmd, opcode), 4),
            ("flags", offset_of!(VgpuCmd, flags), 4),
            ("copy", args, size_of::<VgpuCopyArgs>()),
            ("fill", args, size_of::<VgpuFillArgs>()),
            ("module_load", args, size_of::<VgpuModuleLoadArgs>()),
            ("module_unload", args, size_of::<VgpuModuleUnloadArgs>()),
            ("launch", args, size_of::<VgpuLaunchArgs>()),
            ("func_info", args, size_of::<VgpuFuncInfoArgs>()),
            ("occupancy", args, size_of::<VgpuOccupancyArgs>()),
            ("console", args, size_of::<VgpuConsoleArgs>()),
            ("value", args, size_of::<VgpuValueArgs>()),
            ("array", args, size_of::<VgpuArrayArgs>()),
            ("array_copy", args, size_of::<VgpuArrayCopyArgs>()),
            ("object", args, size_of::<VgpuObjectArgs>()),
            ("object_destroy", args, size_of::<VgpuObjectDestroyArgs>()),
            ("raw", args, 88),
            ("status", offset_of!(VgpuCmd, status), 4),
            ("error", offset_of!(VgpuCmd, error), 4),
            ("result", offset_of!(VgpuCmd, result), 8),
            ("device_ns", offset_of!(VgpuCmd, device_ns), 8),
            ("result2", offset_of!(VgpuCmd, result2), 8),
        ]
    }
}

uapi_struct!(
    /// VGPU_IOCTL_SUBMIT.
    pub struct VgpuSubmit => "vgpu_submit" {
        /// User pointer to `VgpuCmd[count]`.
        pub cmds: u64,
        pub count: u32,
        /// `SUBMIT_*`.
        pub flags: u32,
        pub timeout_ns: u64,
        /// Out: the batch's fence.
        pub fence: u64,
        /// Out: offending or first failed command, or [`NO_INDEX`].
        pub error_index: u32,
        /// Out (with `SUBMIT_WAIT`): the batch outcome.
        pub error: i32,
    }
);

uapi_struct!(
    /// VGPU_IOCTL_WAIT.
    pub struct VgpuWait => "vgpu_wait" {
        pub fence: u64,
        pub timeout_ns: u64,
        /// User pointer for results, or 0.
        pub cmds: u64,
        pub count: u32,
        /// `WAIT_*`.
        pub flags: u32,
        pub error_fence: u64,
        pub error_index: u32,
        pub error: i32,
    }
);

uapi_struct!(
    /// VGPU_IOCTL_USAGE.
    pub struct VgpuUsage => "vgpu_usage" {
        /// Device memory used by all files of the function.
        pub mem_used: u64,
        /// Device time consumed, ns.
        pub busy_ns: u64,
        /// Commands completed by the device.
        pub commands: u64,
        /// Bytes allocated through this file.
        pub file_mem_used: u64,
        pub file_allocs: u32,
        pub file_modules: u32,
        pub file_inflight: u32,
        pub file_uncollected: u32,
        pub open_files: u32,
        pub processes: u32,
        pub device_errors: u32,
        pub recoveries: u32,
        /// This file's device context (its owner's for a lane); 0
        /// without [`INFO_CONTEXTS`].
        pub context: u32,
        /// Contexts the function has now.
        pub contexts: u32,
        /// What this file's context will hold of its own once it starts,
        /// not yet in `mem_used`: free memory for this file is
        /// `mem_size - mem_used - context_pending`.
        pub context_pending: u64,
        /// The function's memory size now, which a live resize changes;
        /// 0 from a driver that predates it.
        pub mem_size: u64,
        pub reserved: u64,
    }
);

impl VgpuUsage {
    /// The function's memory size: what the device says now, or `info`'s
    /// (the size at probe) from a driver that does not say.
    pub fn total(&self, info: &VgpuInfo) -> u64 {
        if self.mem_size != 0 {
            self.mem_size
        } else {
            info.mem_size
        }
    }

    /// Device memory this file cannot allocate: what the function's files
    /// hold, with what its own context will hold once it starts.
    pub fn mem_held(&self) -> u64 {
        self.mem_used.saturating_add(self.context_pending)
    }
}

uapi_struct!(
    /// VGPU_IOCTL_PIN and VGPU_IOCTL_UNPIN.
    pub struct VgpuPin => "vgpu_pin" {
        /// Start of the range, page-aligned.
        pub addr: u64,
        /// Bytes, a multiple of the page size (0 for UNPIN).
        pub size: u64,
    }
);

// <asm-generic/ioctl.h>, the encoding x86-64 uses.
const IOC_NRBITS: u32 = 8;
const IOC_TYPEBITS: u32 = 8;
const IOC_SIZEBITS: u32 = 14;
const IOC_NRSHIFT: u32 = 0;
const IOC_TYPESHIFT: u32 = IOC_NRSHIFT + IOC_NRBITS;
const IOC_SIZESHIFT: u32 = IOC_TYPESHIFT + IOC_TYPEBITS;
const IOC_DIRSHIFT: u32 = IOC_SIZESHIFT + IOC_SIZEBITS;
/// `_IOC_NONE`.
pub const IOC_NONE: u32 = 0;
/// `_IOC_WRITE`.
pub const IOC_WRITE: u32 = 1;
/// `_IOC_READ`.
pub const IOC_READ: u32 = 2;

/// `_IOC(dir, type, nr, size)`.
pub const fn ioc(dir: u32, ty: u8, nr: u8, size: usize) -> u64 {
    assert!(size < 1 << IOC_SIZEBITS);
    ((dir << IOC_DIRSHIFT)
        | ((ty as u32) << IOC_TYPESHIFT)
        | ((nr as u32) << IOC_NRSHIFT)
        | ((size as u32) << IOC_SIZESHIFT)) as u64
}

/// The driver's request `nr` passing a `T`, in direction `dir`.
const fn vgpu_ioc<T>(dir: u32, nr: u8) -> u64 {
    ioc(dir, IOCTL_MAGIC, nr, size_of::<T>())
}

pub const IOCTL_INFO: u64 = vgpu_ioc::<VgpuInfo>(IOC_READ, 0xa0);
pub const IOCTL_ALLOC: u64 = vgpu_ioc::<VgpuAlloc>(IOC_READ | IOC_WRITE, 0xa1);
pub const IOCTL_FREE: u64 = vgpu_ioc::<VgpuFree>(IOC_WRITE, 0xa2);
pub const IOCTL_SUBMIT: u64 = vgpu_ioc::<VgpuSubmit>(IOC_READ | IOC_WRITE, 0xa3);
pub const IOCTL_WAIT: u64 = vgpu_ioc::<VgpuWait>(IOC_READ | IOC_WRITE, 0xa4);
pub const IOCTL_USAGE: u64 = vgpu_ioc::<VgpuUsage>(IOC_READ, 0xa5);
pub const IOCTL_PIN: u64 = vgpu_ioc::<VgpuPin>(IOC_WRITE, 0xa6);
pub const IOCTL_UNPIN: u64 = vgpu_ioc::<VgpuPin>(IOC_WRITE, 0xa7);
pub const IOCTL_LANE: u64 = vgpu_ioc::<VgpuLane>(IOC_READ | IOC_WRITE, 0xa8);
pub const IOCTL_VMM: u64 = vgpu_ioc::<VgpuVmm>(IOC_READ | IOC_WRITE, 0xa9);

/// Encodes an entry point name: `None` if empty, too long (31 bytes at
/// most) or containing a NUL.
pub fn entry_name(name: &str) -> Option<[u8; ENTRY_NAME_LEN]> {
    let b = name.as_bytes();
    if b.is_empty() || b.len() >= ENTRY_NAME_LEN || b.contains(&0) {
        return None;
    }
    let mut out = [0u8; ENTRY_NAME_LEN];
    out[..b.len()].copy_from_slice(b);
    Some(out)
}

/// Builders of the commands whose argument is the union member named
/// like the builder.
macro_rules! cmd_builders {
    ($( $(#[$m:meta])* $name:ident($ty:ty) => $op:ident ),* $(,)?) => {
        $(
            $(#[$m])*
            pub fn $name(args: $ty) -> Self {
                let mut c = Self::bare($op, 0);
                c.args.$name = args;
                c
            }
        )*
    };
}

impl VgpuCmd {
    /// A command with only an opcode and flags (NOP, FENCE, TIMESTAMP).
    pub fn bare(opcode: u32, flags: u32) -> Self {
        VgpuCmd {
            opcode,
            flags,
            ..Default::default()
        }
    }

    cmd_builders!(
        /// A COPY.
        copy(VgpuCopyArgs) => CMD_COPY,
        /// A FILL.
        fill(VgpuFillArgs) => CMD_FILL,
        /// A MODULE_LOAD.
        module_load(VgpuModuleLoadArgs) => CMD_MODULE_LOAD,
        /// A LAUNCH.
        launch(VgpuLaunchArgs) => CMD_LAUNCH,
        /// A FUNC_INFO.
        func_info(VgpuFuncInfoArgs) => CMD_FUNC_INFO,
        /// An OCCUPANCY.
        occupancy(VgpuOccupancyArgs) => CMD_OCCUPANCY,
        /// A CONSOLE.
        console(VgpuConsoleArgs) => CMD_CONSOLE,
    );

    /// A WRITE_VALUE or WAIT_VALUE (`opcode`) with its flags.
    pub fn value(opcode: u32, flags: u32, args: VgpuValueArgs) -> Self {
        let mut c = Self::bare(opcode, flags);
        c.args.value = args;
        c
    }

    /// An ARRAY_CREATE with its `ARRAY_FLAG_*` flags.
    pub fn array(flags: u32, args: VgpuArrayArgs) -> Self {
        let mut c = Self::bare(CMD_ARRAY_CREATE, flags);
        c.args.array = args;
        c
    }

    /// An ARRAY_COPY with its `ARRAY_COPY_*` flags.
    pub fn array_copy(flags: u32, args: VgpuArrayCopyArgs) -> Self {
        let mut c = Self::bare(CMD_ARRAY_COPY, flags);
        c.args.array_copy = args;
        c
    }

    /// An OBJECT_CREATE of `kind` (`OBJECT_TEXTURE`, `OBJECT_SURFACE`).
    pub fn object(kind: u32, args: VgpuObjectArgs) -> Self {
        let mut c = Self::bare(CMD_OBJECT_CREATE, kind);
        c.args.object = args;
        c
    }

    /// An OBJECT_DESTROY of `kind` (`OBJECT_*`).
    pub fn object_destroy(kind: u32, handle: u64) -> Self {
        let mut c = Self::bare(CMD_OBJECT_DESTROY, kind);
        c.args.object_destroy = VgpuObjectDestroyArgs { handle };
        c
    }

    /// A MODULE_UNLOAD.
    pub fn module_unload(module: u64) -> Self {
        let mut c = Self::bare(CMD_MODULE_UNLOAD, 0);
        c.args.module_unload = VgpuModuleUnloadArgs { module };
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::process::Command;

    #[test]
    fn the_uuid_is_the_functions_pci_identity() {
        let info = VgpuInfo {
            pci_domain: 0x0001_0002,
            pci_bus: 0x03,
            pci_devfn: 0x20,
            vendor_id: 0x1af4,
            device_id: 0x10f0,
            subsystem_id: 0x0007,
            ..Default::default()
        };
        assert_eq!(
            info.uuid(),
            [
                b'V', b'G', b'P', b'U', 0x02, 0x00, 0x01, 0x00, 0x03, 0x20, 0xf4, 0x1a, 0xf0, 0x10,
                0x07, 0x00
            ]
        );
    }

    fn uapi_include_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest-driver/include")
    }

    /// (C name, size, fields) of every structure.
    type Layout = (&'static str, usize, Vec<(&'static str, usize, usize)>);

    fn struct_layouts() -> Vec<Layout> {
        macro_rules! layouts {
            ($($t:ty),*) => {
                vec![$( (<$t>::C_NAME, size_of::<$t>(), <$t>::c_fields()) ),*]
            };
        }
        layouts!(
            VgpuInfo,
            VgpuAlloc,
            VgpuFree,
            VgpuCopyArgs,
            VgpuFillArgs,
            VgpuModuleLoadArgs,
            VgpuModuleUnloadArgs,
            VgpuLaunchArgs,
            VgpuFuncInfoArgs,
            VgpuOccupancyArgs,
            VgpuConsoleArgs,
            VgpuCmd,
            VgpuSubmit,
            VgpuWait,
            VgpuUsage,
            VgpuPin,
            VgpuValueArgs,
            VgpuArrayArgs,
            VgpuArrayCopyArgs,
            VgpuObjectArgs,
            VgpuObjectDestroyArgs,
            VgpuLane,
            VgpuVmm
        )
    }

    /// (C name, value) of every constant: the C name is the Rust one
    /// with `VGPU_` before it.
    fn constants() -> Vec<(&'static str, u64)> {
        macro_rules! constants {
            ($($c:ident),*) => {
                vec![$( (concat!("VGPU_", stringify!($c)), $c as u64) ),*]
            };
        }
        constants!(
            UAPI_VERSION,
            MAX_BATCH_CMDS,
            MAX_COPY_BYTES,
            MAX_BATCH_PIN_BYTES,
            MAX_IMAGE_BYTES,
            MAX_PARAMS_BYTES,
            MAX_BATCH_STAGED_BYTES,
            MAX_UNCOLLECTED,
            ENTRY_NAME_LEN,
            MAX_FUNC_NAME_BYTES,
            MAX_PINNED_RANGES,
            MAX_CONSOLE_BYTES,
            MODULE_PRINTS,
            TIMEOUT_INFINITE,
            INFO_POLLED,
            INFO_MSIX,
            INFO_WINDOW,
            INFO_FUNC_INFO,
            INFO_OCCUPANCY,
            INFO_CONSOLE,
            INFO_CONTEXTS,
            INFO_VMM,
            VMM_RESERVE,
            VMM_FREE,
            VMM_CREATE,
            VMM_RELEASE,
            VMM_MAP,
            VMM_UNMAP,
            VMM_ACCESS,
            VMM_ACCESS_NONE,
            VMM_ACCESS_READ,
            VMM_ACCESS_RW,
            VMM_GRANULE,
            CMD_NOP,
            CMD_FENCE,
            CMD_COPY,
            CMD_FILL,
            CMD_MODULE_LOAD,
            CMD_MODULE_UNLOAD,
            CMD_LAUNCH,
            CMD_FUNC_INFO,
            CMD_OCCUPANCY,
            CMD_CONSOLE,
            CMD_LAUNCH_FUNCTION,
            CMD_LAUNCH_COOPERATIVE,
            CMD_FUNC_INFO_GLOBAL,
            CMD_TIMESTAMP,
            CMD_FENCE_IRQ,
            MEM_USER,
            MEM_DEVICE,
            MEM_WINDOW,
            MODULE_PTX,
            MODULE_FATBIN,
            MODULE_CUBIN,
            MODULE_BUILTIN_ID,
            CMD_STATUS_OK,
            CMD_STATUS_INVALID,
            CMD_STATUS_FAULT,
            CMD_STATUS_NO_MEMORY,
            CMD_STATUS_UNSUPPORTED,
            CMD_STATUS_NOT_FOUND,
            CMD_STATUS_CANCELLED,
            CMD_STATUS_OUT_OF_RANGE,
            CMD_STATUS_DEVICE_ERROR,
            CMD_STATUS_KERNEL_FAULT,
            CMD_STATUS_KERNEL_ASSERT,
            CMD_STATUS_CONTEXT_LOST,
            SUBMIT_WAIT,
            NO_INDEX,
            WAIT_ALL,
            IOCTL_MAGIC,
            IOCTL_INFO,
            IOCTL_ALLOC,
            IOCTL_FREE,
            IOCTL_SUBMIT,
            IOCTL_WAIT,
            IOCTL_USAGE,
            IOCTL_PIN,
            IOCTL_UNPIN,
            IOCTL_LANE,
            IOCTL_VMM,
            CMD_WRITE_VALUE,
            CMD_WAIT_VALUE,
            CMD_VALUE_32,
            CMD_WAIT_GEQ,
            CMD_WAIT_EQ,
            CMD_WAIT_AND,
            CMD_WAIT_NOR,
            CMD_ARRAY_CREATE,
            CMD_ARRAY_COPY,
            CMD_OBJECT_CREATE,
            CMD_OBJECT_DESTROY,
            CMD_ARRAY_LAYERED,
            CMD_ARRAY_SURFACE,
            CMD_ARRAY_CUBEMAP,
            CMD_COPY_SRC_ARRAY,
            CMD_COPY_DST_ARRAY,
            OBJ_ARRAY,
            OBJ_TEXTURE,
            OBJ_SURFACE
        )
    }

    /// Compiles and runs a C program that prints, from the header itself,
    /// every structure's size, every field's offset and size, every
    /// constant and ioctl number; all must equal the Rust definitions.
    #[test]
    fn test_layout_matches_uapi_header() {
        let mut c = String::from(
            "#include <stdio.h>\n#include <stddef.h>\n#include \"uapi/vgpu.h\"\n\
             #define S(t) printf(\"size %s %zu\\n\", #t, sizeof(struct t));\n\
             #define F(t, f) printf(\"field %s.%s %zu %zu\\n\", #t, #f, \
             offsetof(struct t, f), sizeof(((struct t *)0)->f));\n\
             #define C(n) printf(\"const %s %llu\\n\", #n, (unsigned long long)(n));\n\
             int main(void) {\n",
        );
        let mut want = BTreeMap::new();
        for (name, size, fields) in struct_layouts() {
            c.push_str(&format!("S({name})\n"));
            want.insert(format!("size {name}"), size.to_string());
            for (f, off, sz) in fields {
                c.push_str(&format!("F({name}, {f})\n"));
                want.insert(format!("field {name}.{f}"), format!("{off} {sz}"));
            }
        }
        for (name, value) in constants() {
            c.push_str(&format!("C({name})\n"));
            want.insert(format!("const {name}"), value.to_string());
        }
        c.push_str("return 0;\n}\n");

        let dir = std::env::temp_dir().join(format!("vgpu-guest-uapi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("layout.c");
        let exe = dir.join("layout");
        std::fs::write(&src, &c).unwrap();
        crate::compile_c(
            Command::new("gcc")
                .args(["-std=gnu11", "-Wall", "-Werror", "-I"])
                .arg(uapi_include_dir())
                .arg("-o")
                .arg(&exe)
                .arg(&src),
            "gcc failed",
        );
        let run = Command::new(&exe).output().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(run.status.success());
        let text = String::from_utf8(run.stdout).unwrap();
        let mut got = BTreeMap::new();
        for line in text.lines() {
            let mut parts = line.splitn(3, ' ');
            let kind = parts.next().unwrap();
            let name = parts.next().unwrap();
            got.insert(format!("{kind} {name}"), parts.next().unwrap().to_string());
        }
        let mut diffs = Vec::new();
        for (k, v) in &want {
            match got.get(k) {
                Some(g) if g == v => {}
                g => diffs.push(format!("{k}: C {g:?}, Rust {v}")),
            }
        }
        assert!(diffs.is_empty(), "uapi drift:\n{}", diffs.join("\n"));
        assert_eq!(got.len(), want.len());
    }

    #[test]
    fn test_cmd_builders_zero_the_rest_of_the_union() {
        let c = VgpuCmd::fill(VgpuFillArgs {
            addr: 0x1000,
            size: 8,
            pattern: 0xffff_ffff,
            pad: 0,
        });
        let raw = c.args.raw();
        assert_eq!(raw[0], 0x1000);
        assert_eq!(raw[1], 8);
        assert_eq!(raw[2], 0xffff_ffff);
        assert!(raw[3..].iter().all(|w| *w == 0));
        assert_eq!(c.opcode, CMD_FILL);
    }

    #[test]
    fn test_entry_name() {
        assert_eq!(&entry_name("copy").unwrap()[..5], b"copy\0");
        assert!(entry_name("").is_none());
        assert!(entry_name(&"x".repeat(31)).is_some());
        assert!(entry_name(&"x".repeat(32)).is_none());
        assert!(entry_name("a\0b").is_none());
    }
}
