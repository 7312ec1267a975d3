//! The guest ABI of a vgpud virtual GPU function: everything the guest
//! driver and the device must agree on. `docs/guest-abi.md` explains it;
//! `guest-driver/include/vgpu_abi.h` is generated from this file by
//! [`c_header`] and a test keeps the two identical.
//!
//! All multi-byte values are little-endian. Structures are `repr(C)` with
//! no padding (checked at compile time), so any byte pattern is a valid
//! value and they can be read straight from guest memory.

#![warn(missing_docs)]

use std::fmt::Write as _;

pub use vm_memory::ByteValued;

/// Default PCI vendor id (configurable per instance).
pub const PCI_VENDOR_ID: u16 = 0x1ee7;
/// Default PCI device id of a vGPU function.
pub const PCI_DEVICE_ID: u16 = 0x0100;
/// Default PCI subsystem vendor id.
pub const PCI_SUBSYSTEM_VENDOR_ID: u16 = 0x1ee7;
/// Default PCI subsystem id.
pub const PCI_SUBSYSTEM_ID: u16 = 0x0001;
/// PCI class code: display controller, 3D controller.
pub const PCI_CLASS: u32 = 0x03_02_00;
/// PCI revision of this ABI.
pub const PCI_REVISION: u8 = 1;

/// Value of [`REG_MAGIC`]: "VGPU".
pub const ABI_MAGIC: u32 = 0x5550_4756;
/// ABI major version, in the high half of [`REG_VERSION`].
pub const ABI_VERSION_MAJOR: u32 = 1;
/// ABI minor version, in the low half of [`REG_VERSION`].
pub const ABI_VERSION_MINOR: u32 = 8;

/// BAR holding registers, doorbells and the MSI-X table.
pub const BAR_REGS: u32 = 0;
/// BAR holding the host-visible memory window (64-bit, prefetchable).
pub const BAR_WINDOW: u32 = 2;
/// Size of BAR0.
pub const BAR0_SIZE: u64 = 0x4000;

/// Most queues a function offers.
pub const MAX_QUEUES: u32 = 16;
/// Largest ring a queue accepts (entries, a power of two).
pub const MAX_QUEUE_SIZE: u32 = 1024;
/// MSI-X vector of device errors; queue `q` uses vector `q + 1` by default.
pub const MSIX_ERROR_VECTOR: u32 = 0;
/// MSI-X vectors: one for errors plus one per queue.
pub const MSIX_VECTORS: u32 = MAX_QUEUES + 1;
/// "No vector" in [`QREG_MSIX_VECTOR`].
pub const MSIX_NO_VECTOR: u32 = 0xffff;

// Global registers in BAR0 (32-bit unless noted).
/// Read-only: [`ABI_MAGIC`].
pub const REG_MAGIC: u64 = 0x000;
/// Read-only: `major << 16 | minor`.
pub const REG_VERSION: u64 = 0x004;
/// Read-only, 64-bit: `FEATURE_*` bits.
pub const REG_FEATURES: u64 = 0x008;
/// Read-only, 64-bit: device memory of the partition, bytes: its quota,
/// which changes while the function runs where [`FEATURE_RESIZE`] says
/// so ([`IRQ_CAUSE_CONFIG`] tells the driver).
pub const REG_MEM_SIZE: u64 = 0x010;
/// Read-only: compute units of the partition.
pub const REG_COMPUTE_UNITS: u64 = 0x018;
/// Read-only: number of queues.
pub const REG_MAX_QUEUES: u64 = 0x01c;
/// Read-only, 64-bit: size of the host-visible window (BAR2).
pub const REG_WINDOW_SIZE: u64 = 0x020;
/// Read-only: largest ring size.
pub const REG_MAX_QUEUE_SIZE: u64 = 0x028;
/// Read-only: offset of the doorbell page in BAR0.
pub const REG_DOORBELL_OFFSET: u64 = 0x02c;
/// Read-write: `CONTROL_*` bits.
pub const REG_CONTROL: u64 = 0x030;
/// Read-only: `STATUS_*` bits.
pub const REG_STATUS: u64 = 0x034;
/// Read, write 1 to clear: `IRQ_CAUSE_*` bits.
pub const REG_IRQ_CAUSE: u64 = 0x038;
/// Read-write: `IRQ_CAUSE_*` bits that do not raise an interrupt.
pub const REG_IRQ_MASK: u64 = 0x03c;
/// Write-only, trapped: wakes the device's poller (value: queue index, ignored).
pub const REG_WAKE: u64 = 0x040;
/// Read-only: errors logged since reset; entry `n % ERROR_LOG_ENTRIES` is the newest.
pub const REG_ERROR_COUNT: u64 = 0x044;
/// Read-only, 64-bit: device memory in use, bytes.
pub const REG_MEM_USED: u64 = 0x048;
/// Read-only, 64-bit: device time consumed since reset, nanoseconds.
pub const REG_BUSY_NS: u64 = 0x050;
/// Read-only, 64-bit: commands completed since reset.
pub const REG_COMMANDS: u64 = 0x058;
/// Read-only: contexts (besides context 0) the function may have at once,
/// 0 where it offers none ([`FEATURE_CONTEXTS`]).
pub const REG_MAX_CONTEXTS: u64 = 0x060;
/// Read-only: contexts (besides context 0) the function has now.
pub const REG_CONTEXTS: u64 = 0x064;
/// Read-only, 64-bit: device memory each context besides 0 holds of its
/// own while it lives (a GPU context's own memory), counted in
/// [`REG_MEM_USED`] from its first command to its end; 0 where contexts
/// cost nothing. ABI minor version 7.
pub const REG_CONTEXT_COST: u64 = 0x068;

/// Error log: [`ERROR_LOG_ENTRIES`] entries of [`ErrorLogEntry`].
pub const ERROR_LOG_OFFSET: u64 = 0x100;
/// Entries in the error log ring.
pub const ERROR_LOG_ENTRIES: u32 = 16;

/// Queue register blocks start here, [`QUEUE_REGS_STRIDE`] bytes each.
pub const QUEUE_REGS_OFFSET: u64 = 0x400;
/// Size of one queue's register block.
pub const QUEUE_REGS_STRIDE: u64 = 0x40;
/// Read-write: ring entries (power of two, at most [`REG_MAX_QUEUE_SIZE`]).
pub const QREG_SIZE: u64 = 0x00;
/// Read-write: `QCONTROL_*` bits.
pub const QREG_CONTROL: u64 = 0x04;
/// Read-only: `QSTATUS_*` bits.
pub const QREG_STATUS: u64 = 0x08;
/// Read-only: `ERR_*` code of a queue in error.
pub const QREG_ERROR: u64 = 0x0c;
/// Read-write, 64-bit: descriptor table address.
pub const QREG_DESC: u64 = 0x10;
/// Read-write, 64-bit: available ring address.
pub const QREG_AVAIL: u64 = 0x18;
/// Read-write, 64-bit: used ring address.
pub const QREG_USED: u64 = 0x20;
/// Read-write: MSI-X vector for completions, or [`MSIX_NO_VECTOR`].
pub const QREG_MSIX_VECTOR: u64 = 0x28;

/// The doorbell page (mapped into the guest, polled by the device).
pub const DOORBELL_OFFSET: u64 = 0x1000;
/// Size of the doorbell page.
pub const DOORBELL_SIZE: u64 = 0x1000;
/// Bytes per queue in the doorbell page (one cache line).
pub const DOORBELL_STRIDE: u64 = 64;
/// In a queue's doorbell slot, 32-bit, written by the guest: the new
/// available index after adding buffers.
pub const DB_AVAIL_IDX: u64 = 0;
/// In a queue's doorbell slot, 32-bit, written by the device: 1 while the
/// device polls this queue (no wake-up needed), 0 when it sleeps.
pub const DB_POLLING: u64 = 4;

/// MSI-X table offset in BAR0.
pub const MSIX_TABLE_OFFSET: u64 = 0x2000;
/// MSI-X PBA offset in BAR0.
pub const MSIX_PBA_OFFSET: u64 = 0x3000;

/// Feature: rings use the event index (VIRTIO_RING_F_EVENT_IDX).
pub const FEATURE_EVENT_IDX: u64 = 1 << 0;
/// Feature: queues may be polled through the doorbell page.
pub const FEATURE_POLLED: u64 = 1 << 1;
/// Feature: BAR2 is a host-visible window of device memory.
pub const FEATURE_WINDOW: u64 = 1 << 2;
/// Feature: the TIMESTAMP command.
pub const FEATURE_TIMESTAMP: u64 = 1 << 3;
/// Feature: the FUNC_INFO command and launches by function handle
/// ([`LAUNCH_FLAG_FUNCTION`]); ABI minor version 1.
pub const FEATURE_FUNC_INFO: u64 = 1 << 4;
/// Feature: the OCCUPANCY command; ABI minor version 2.
pub const FEATURE_OCCUPANCY: u64 = 1 << 5;
/// Feature: the CONSOLE command and [`MODULE_FLAG_PRINTS`]; ABI minor
/// version 3.
pub const FEATURE_CONSOLE: u64 = 1 << 6;
/// Feature: the WRITE_VALUE and WAIT_VALUE commands; ABI minor version 4.
pub const FEATURE_VALUES: u64 = 1 << 7;
/// Feature: contexts, each with its own device memory, modules and
/// faults (bits [`CMD_CTX_SHIFT`].. of a command's flags, CTX_DESTROY,
/// [`STATUS_CONTEXT_LOST`]); ABI minor version 5.
pub const FEATURE_CONTEXTS: u64 = 1 << 8;
/// Feature: cooperative launches ([`LAUNCH_FLAG_COOPERATIVE`]): every
/// block of the grid resident at once, so that they can synchronise;
/// ABI minor version 5.
pub const FEATURE_COOPERATIVE: u64 = 1 << 9;
/// Feature: virtual memory management (VA_RESERVE, MEM_CREATE, MEM_MAP,
/// MEM_ACCESS): address ranges reserved, physical allocations made apart
/// from any address and mapped into them; ABI minor version 6.
pub const FEATURE_VMM: u64 = 1 << 10;
/// Feature: CUDA arrays, texture and surface objects (ARRAY_CREATE,
/// ARRAY_COPY, OBJECT_CREATE, OBJECT_DESTROY); ABI minor version 6.
pub const FEATURE_ARRAYS: u64 = 1 << 11;
/// Feature: [`REG_MEM_SIZE`] may change while the function runs (the
/// host resizes the partition's quota), and each change raises
/// [`IRQ_CAUSE_CONFIG`]; ABI minor version 8.
pub const FEATURE_RESIZE: u64 = 1 << 12;

/// CONTROL: the function runs.
pub const CONTROL_ENABLE: u32 = 1 << 0;
/// CONTROL: reset the function (self-clearing).
pub const CONTROL_RESET: u32 = 1 << 1;
/// STATUS: enabled.
pub const STATUS_ENABLED: u32 = 1 << 0;
/// STATUS: a fatal error stopped the function; reset to recover.
pub const STATUS_FATAL: u32 = 1 << 1;
/// IRQ cause: a queue completed work.
pub const IRQ_CAUSE_QUEUE: u32 = 1 << 0;
/// IRQ cause: an error was logged.
pub const IRQ_CAUSE_ERROR: u32 = 1 << 1;
/// IRQ cause: the function's configuration changed ([`REG_MEM_SIZE`]);
/// raised on [`MSIX_ERROR_VECTOR`]. ABI minor version 8.
pub const IRQ_CAUSE_CONFIG: u32 = 1 << 2;

/// QCONTROL: the queue runs.
pub const QCONTROL_ENABLE: u32 = 1 << 0;
/// QCONTROL: the device polls the doorbell page for this queue.
pub const QCONTROL_POLLED: u32 = 1 << 1;
/// QSTATUS: enabled.
pub const QSTATUS_ENABLED: u32 = 1 << 0;
/// QSTATUS: stopped by an error; disable and re-enable to recover.
pub const QSTATUS_ERROR: u32 = 1 << 1;

/// Error code: none.
pub const ERR_NONE: u32 = 0;
/// Error code: a ring is not in readable and writable shared memory.
pub const ERR_RING_ADDRESS: u32 = 1;
/// Error code: the ring is corrupt (bad index, loop, bad descriptor).
pub const ERR_RING_CORRUPT: u32 = 2;
/// Error code: queue size or configuration invalid.
pub const ERR_QUEUE_CONFIG: u32 = 3;
/// Error code: a register access was invalid.
pub const ERR_REGISTER: u32 = 4;
/// Error code: the backend failed.
pub const ERR_BACKEND: u32 = 5;

/// Command: do nothing.
pub const OP_NOP: u32 = 0;
/// Command: write a 64-bit value to guest memory once earlier commands are done.
pub const OP_FENCE: u32 = 1;
/// Command: allocate device memory.
pub const OP_MEM_ALLOC: u32 = 2;
/// Command: free device memory.
pub const OP_MEM_FREE: u32 = 3;
/// Command: copy between guest memory, device memory and the window.
pub const OP_COPY: u32 = 4;
/// Command: fill device memory with a 32-bit pattern.
pub const OP_FILL: u32 = 5;
/// Command: load a module.
pub const OP_MODULE_LOAD: u32 = 6;
/// Command: unload a module.
pub const OP_MODULE_UNLOAD: u32 = 7;
/// Command: run a kernel.
pub const OP_LAUNCH: u32 = 8;
/// Command: read the device clock.
pub const OP_TIMESTAMP: u32 = 9;
/// Command: look up an entry point of a loaded module: its parameter
/// layout and attributes, and a function handle to launch it by.
pub const OP_FUNC_INFO: u32 = 10;
/// Command: how many thread block clusters of a launch shape can be
/// resident on the device at once, as the backend's driver counts them
/// (clusters must fit within one group of SMs, which only the driver
/// knows).
pub const OP_OCCUPANCY: u32 = 11;
/// Command: take what the kernels of a module printed (`printf` in device
/// code), oldest first, into guest memory.
pub const OP_CONSOLE: u32 = 12;
/// Command: write a 32- or 64-bit value to guest memory once earlier
/// commands of the queue are done (a semaphore release).
pub const OP_WRITE_VALUE: u32 = 13;
/// Command: hold the queue until a 32- or 64-bit word of guest memory
/// meets a condition (a semaphore acquire); later commands of the queue
/// wait for it, other queues do not.
pub const OP_WAIT_VALUE: u32 = 14;
/// Command: end a context (the one its flags name): its device memory and
/// modules are freed, and its id may be used again; ABI minor version 5.
pub const OP_CTX_DESTROY: u32 = 15;
/// Command: reserve a range of device addresses with nothing behind it
/// (with [`VA_FLAG_FREE`]: free one); ABI minor version 6.
pub const OP_VA_RESERVE: u32 = 16;
/// Command: make a physical allocation, device memory with no address
/// until it is mapped (with [`MEM_CREATE_FLAG_RELEASE`]: release one).
pub const OP_MEM_CREATE: u32 = 17;
/// Command: map a piece of a physical allocation into a reserved range
/// (with [`MEM_MAP_FLAG_UNMAP`]: unmap a range).
pub const OP_MEM_MAP: u32 = 18;
/// Command: set what kernels and copies may do to a mapped range.
pub const OP_MEM_ACCESS: u32 = 19;
/// Command: make a CUDA array (an image of 1, 2 or 4 channels of one
/// element type: 1D, 2D, 3D or layered); the result is its handle
/// (ABI 1.6, [`FEATURE_ARRAYS`]).
pub const OP_ARRAY_CREATE: u32 = 20;
/// Command: copy a box between arrays and device memory (ABI 1.6).
pub const OP_ARRAY_COPY: u32 = 21;
/// Command: make a texture or surface object, whose handle kernels use
/// (ABI 1.6).
pub const OP_OBJECT_CREATE: u32 = 22;
/// Command: destroy an array, a texture or a surface object (ABI 1.6).
pub const OP_OBJECT_DESTROY: u32 = 23;

/// A command's flags carry its context in these bits (ABI 1.5, with
/// [`FEATURE_CONTEXTS`]): 0 is the function's own context, which every
/// driver without contexts uses; 1 to [`MAX_CONTEXT_ID`] are contexts
/// the driver numbers, made by their first command that needs one.
pub const CMD_CTX_SHIFT: u32 = 16;
/// Mask of the context bits of a command's flags.
pub const CMD_CTX_MASK: u32 = 0xffff << CMD_CTX_SHIFT;
/// Largest context id.
pub const MAX_CONTEXT_ID: u32 = 0xffff;

/// FENCE flag: raise the queue's interrupt after writing.
pub const FENCE_FLAG_IRQ: u32 = 1 << 0;
/// WRITE_VALUE and WAIT_VALUE flag: the word is 32 bits (4-byte
/// aligned), else 64 (8-byte aligned).
pub const VALUE_FLAG_32: u32 = 1 << 0;
/// WAIT_VALUE condition (flags bits 1-2): `(word - value)` as a signed
/// number is at least 0, so that a counter that wraps still goes forward.
pub const WAIT_GEQ: u32 = 0 << 1;
/// WAIT_VALUE condition: the word equals `value`.
pub const WAIT_EQ: u32 = 1 << 1;
/// WAIT_VALUE condition: `word & value` is not 0.
pub const WAIT_AND: u32 = 2 << 1;
/// WAIT_VALUE condition: `!(word | value)` is not 0.
pub const WAIT_NOR: u32 = 3 << 1;
/// WAIT_VALUE: the condition's bits of the flags.
pub const WAIT_COND_MASK: u32 = 3 << 1;
/// LAUNCH flag: [`LaunchCmd::entry`] holds no name but, little-endian, a
/// function handle that FUNC_INFO returned for [`LaunchCmd::module`] (8
/// bytes), the blocks per thread block cluster in x, y and z (3 x 4
/// bytes; zeros: no clusters), then 12 zero bytes.
pub const LAUNCH_FLAG_FUNCTION: u32 = 1 << 0;
/// LAUNCH flag: a cooperative launch (ABI 1.5, [`FEATURE_COOPERATIVE`]):
/// refused with INVALID unless every block of the grid can be resident
/// at once, as OCCUPANCY counts them.
pub const LAUNCH_FLAG_COOPERATIVE: u32 = 1 << 1;
/// FUNC_INFO flag: describe the module global `name` instead of a kernel:
/// the device writes a [`GlobalInfo`] at `out`, the result is its device
/// address and [`Completion::result2`] its size. The global is then one
/// of the partition's allocations (COPY and FILL reach it, MEM_FREE does
/// not free it) until its module is unloaded.
pub const FUNC_INFO_FLAG_GLOBAL: u32 = 1 << 0;
/// VA_RESERVE flag: free the reservation that starts at `addr` and is
/// `size` bytes long (nothing may be mapped in it any more).
pub const VA_FLAG_FREE: u32 = 1 << 0;
/// MEM_CREATE flag: release the physical allocation `handle`; its memory
/// is freed once nothing maps it.
pub const MEM_CREATE_FLAG_RELEASE: u32 = 1 << 0;
/// MEM_MAP flag: unmap `[addr, addr + size)`, which must be whole
/// mappings, every byte mapped.
pub const MEM_MAP_FLAG_UNMAP: u32 = 1 << 0;
/// MEM_ACCESS: no access (a new mapping's).
pub const MEM_ACCESS_NONE: u32 = 0;
/// MEM_ACCESS: kernels and copies may read.
pub const MEM_ACCESS_READ: u32 = 1;
/// MEM_ACCESS: kernels and copies may read and write.
pub const MEM_ACCESS_READ_WRITE: u32 = 3;
/// Virtual memory management: what addresses, sizes, offsets and the
/// alignment of reservations are multiples of (a GPU's 2 MiB pages).
pub const VMM_GRANULARITY: u64 = 2 << 20;
/// Largest reservation (16 TiB): far more than any device's memory, as
/// allocators reserve a multiple of it up front.
pub const VMM_MAX_RESERVATION: u64 = 1 << 44;
/// Largest alignment a reservation may ask for.
pub const VMM_MAX_ALIGN: u64 = 1 << 40;
/// Most reservations of one context at once.
pub const VMM_MAX_RESERVATIONS: u64 = 1 << 12;
/// Most physical allocations, and most mappings, of one context at once.
pub const VMM_MAX_OBJECTS: u64 = 1 << 16;
/// ARRAY_CREATE flag: a layered array (`depth` is its layers).
pub const ARRAY_FLAG_LAYERED: u32 = 1 << 0;
/// ARRAY_CREATE flag: surface objects may be made over the array.
pub const ARRAY_FLAG_SURFACE: u32 = 1 << 1;
/// ARRAY_CREATE flag: a cubemap, `width` = `height` and six faces as its
/// `depth` (with [`ARRAY_FLAG_LAYERED`], six faces a layer).
pub const ARRAY_FLAG_CUBEMAP: u32 = 1 << 2;
/// ARRAY_COPY flag: `src` is an array handle (else a device address).
pub const ARRAY_COPY_SRC_ARRAY: u32 = 1 << 0;
/// ARRAY_COPY flag: `dst` is an array handle (else a device address).
pub const ARRAY_COPY_DST_ARRAY: u32 = 1 << 1;
/// OBJECT_CREATE and OBJECT_DESTROY flags: the kind of object. An array
/// (OBJECT_DESTROY only).
pub const OBJECT_ARRAY: u32 = 0;
/// Object kind: a texture object.
pub const OBJECT_TEXTURE: u32 = 1;
/// Object kind: a surface object.
pub const OBJECT_SURFACE: u32 = 2;
/// OBJECT_CREATE resource: an array handle.
pub const RESOURCE_ARRAY: u32 = 0;
/// OBJECT_CREATE resource: linear device memory (`size` bytes).
pub const RESOURCE_LINEAR: u32 = 1;
/// OBJECT_CREATE resource: pitched device memory (`size` is the pitch).
pub const RESOURCE_PITCH2D: u32 = 2;
// Element types, CUDA's `CUarray_format` numbers.
/// Element type: unsigned 8-bit.
pub const FORMAT_U8: u32 = 0x01;
/// Element type: unsigned 16-bit.
pub const FORMAT_U16: u32 = 0x02;
/// Element type: unsigned 32-bit.
pub const FORMAT_U32: u32 = 0x03;
/// Element type: signed 8-bit.
pub const FORMAT_S8: u32 = 0x08;
/// Element type: signed 16-bit.
pub const FORMAT_S16: u32 = 0x09;
/// Element type: signed 32-bit.
pub const FORMAT_S32: u32 = 0x0a;
/// Element type: IEEE half.
pub const FORMAT_F16: u32 = 0x10;
/// Element type: IEEE single.
pub const FORMAT_F32: u32 = 0x20;
/// Texture address mode (CUDA's numbers): wrap around.
pub const ADDRESS_WRAP: u32 = 0;
/// Texture address mode: clamp to the edge.
pub const ADDRESS_CLAMP: u32 = 1;
/// Texture address mode: mirror.
pub const ADDRESS_MIRROR: u32 = 2;
/// Texture address mode: the border colour outside.
pub const ADDRESS_BORDER: u32 = 3;
/// Texture filter: nearest element.
pub const FILTER_POINT: u32 = 0;
/// Texture filter: linear interpolation of the nearest elements.
pub const FILTER_LINEAR: u32 = 1;
/// Texture flag (CUDA's `CU_TRSF_READ_AS_INTEGER`): integer elements are
/// read as they are, not as normalised floats.
pub const TEX_READ_AS_INTEGER: u32 = 0x01;
/// Texture flag (`CU_TRSF_NORMALIZED_COORDINATES`): coordinates in [0, 1).
pub const TEX_NORMALIZED_COORDINATES: u32 = 0x02;
/// Widest 1D array (elements); also a layered 1D array's.
pub const MAX_ARRAY_1D: u64 = 32768;
/// Widest and tallest 2D array (elements).
pub const MAX_ARRAY_2D: u64 = 65536;
/// Largest dimension of a 3D array and of a layered 2D array's layer.
pub const MAX_ARRAY_3D: u64 = 16384;
/// Most layers of a layered array.
pub const MAX_ARRAY_LAYERS: u64 = 2048;
/// Widest face of a cubemap.
pub const MAX_ARRAY_CUBEMAP: u64 = 16384;
/// Most faces of a layered cubemap (341 layers of six).
pub const MAX_CUBEMAP_FACES: u64 = 2046;
/// Most arrays, texture and surface objects one vGPU context holds.
pub const MAX_OBJECTS: u64 = 1 << 16;

/// Bit of a MODULE_LOAD's [`Completion::result2`]: the module's kernels
/// may print (it calls `vprintf` or `__assertfail`); what they print
/// waits for CONSOLE.
pub const MODULE_FLAG_PRINTS: u64 = 1 << 0;
/// What the device keeps of one module's printed output before it drops
/// the newest (as CUDA's default printf buffer, 1 MiB).
pub const CONSOLE_BYTES: u32 = 1 << 20;
/// Longest entry point name FUNC_INFO takes (C++ kernels have long
/// mangled names).
pub const MAX_ENTRY_NAME: u32 = 4096;
/// Most parameters FUNC_INFO describes: a kernel with more is refused.
pub const MAX_FUNC_PARAMS: u32 = 1024;
/// Most blocks of one thread block cluster (a Hopper GPU's, with
/// non-portable sizes allowed).
pub const MAX_CLUSTER_BLOCKS: u32 = 16;
/// Most blocks of a cluster OCCUPANCY asks about: libraries probe past
/// what a launch may use to learn how the GPU groups its SMs (an H200
/// holds clusters of 17 and 18 single-block SMs, if no launch may).
pub const MAX_OCCUPANCY_CLUSTER_BLOCKS: u32 = 64;

// Launch limits: CUDA's, the same on every GPU since compute capability
// 3.0. A LAUNCH outside them is refused; the guest's libcuda checks them
// too, before a launch is queued, and reports them as device
// attributes. (Not in the C header: the kernel driver never looks at a
// launch's shape.)
/// Most threads of one block.
pub const MAX_BLOCK_THREADS: u32 = 1024;
/// Most threads along a block's x dimension.
pub const MAX_BLOCK_X: u32 = 1024;
/// Most threads along a block's y dimension.
pub const MAX_BLOCK_Y: u32 = 1024;
/// Most threads along a block's z dimension.
pub const MAX_BLOCK_Z: u32 = 64;
/// Most blocks along a grid's x dimension (`INT_MAX`).
pub const MAX_GRID_X: u32 = i32::MAX as u32;
/// Most blocks along a grid's y dimension.
pub const MAX_GRID_Y: u32 = 65535;
/// Most blocks along a grid's z dimension.
pub const MAX_GRID_Z: u32 = 65535;

/// Most function handles one vGPU keeps (they end with their module).
pub const MAX_FUNCTIONS: u32 = 1 << 16;
/// COPY endpoint: guest memory, as a scatter-gather list.
pub const COPY_GUEST: u32 = 0;
/// COPY endpoint: device memory address.
pub const COPY_DEVICE: u32 = 1;
/// COPY endpoint: offset in the host-visible window (BAR2).
pub const COPY_WINDOW: u32 = 2;
/// Most scatter-gather entries per COPY.
pub const MAX_SG_ENTRIES: u32 = 256;
/// Largest parameter block of a LAUNCH: CUDA's limit on a kernel's
/// parameters since CUDA 12.1 (32,764 bytes; 4 KiB before).
pub const MAX_PARAMS_SIZE: u32 = 32764;
/// Largest module image.
pub const MAX_MODULE_SIZE: u64 = 16 << 20;
/// MEM_ALLOC: the alignment of an allocation asked with alignment 0.
pub const ALLOC_DEFAULT_ALIGN: u64 = 256;
/// MEM_ALLOC: the largest alignment an allocation may ask for.
pub const ALLOC_MAX_ALIGN: u64 = 1 << 30;
/// MEM_ALLOC: most live allocations of one vGPU.
pub const MAX_ALLOCATIONS: u64 = 1 << 16;
/// Module format: PTX text.
pub const MODULE_FORMAT_PTX: u32 = 1;
/// Module format: a CUDA fatbinary as `nvcc -fatbin` writes it (magic
/// 0xBA55ED50); a backend runs its PTX or a cubin it can use.
pub const MODULE_FORMAT_FATBIN: u32 = 2;
/// Module format: a cubin, the ELF image of one GPU architecture (what
/// cuBLAS and cuFFT load); only a backend whose GPU runs it loads it.
pub const MODULE_FORMAT_CUBIN: u32 = 3;
/// The built-in module, always loaded.
pub const MODULE_BUILTIN: u64 = 0;

/// Completion status: success.
pub const STATUS_OK: u32 = 0;
/// Completion status: malformed command.
pub const STATUS_INVALID: u32 = 1;
/// Completion status: a guest memory access faulted.
pub const STATUS_FAULT: u32 = 2;
/// Completion status: out of device memory (quota).
pub const STATUS_NO_MEMORY: u32 = 3;
/// Completion status: not supported by this device.
pub const STATUS_UNSUPPORTED: u32 = 4;
/// Completion status: unknown address, module or entry point.
pub const STATUS_NOT_FOUND: u32 = 5;
/// Completion status: cancelled without running. The device writes it
/// when the host shuts down: for commands submitted after the drain began
/// and for those still waiting when its grace ran out. Reset and queue
/// disable drop queued work without completions; drivers also use it for
/// work they give up on.
pub const STATUS_CANCELLED: u32 = 6;
/// Completion status: device memory access outside an allocation.
pub const STATUS_OUT_OF_RANGE: u32 = 7;
/// Completion status: the device failed.
pub const STATUS_DEVICE_ERROR: u32 = 8;
/// Completion status: a kernel of this command accessed device memory
/// it may not (an illegal address). The function's device state is lost,
/// as after DEVICE_ERROR with STATUS.FATAL: later commands fail until a
/// reset.
pub const STATUS_KERNEL_FAULT: u32 = 9;
/// Completion status: a thread of a kernel of this command failed an
/// `assert()` (what it printed waits for CONSOLE). On a GPU the
/// function's device state is lost, as with KERNEL_FAULT; the software
/// backend fails the launch alone. ABI minor version 3.
pub const STATUS_KERNEL_ASSERT: u32 = 10;
/// Completion status: the command's context lost its device state to an
/// earlier fault (a KERNEL_FAULT or DEVICE_ERROR of one of its commands);
/// nothing ran. Only that context is affected; CTX_DESTROY ends it. ABI
/// minor version 5.
pub const STATUS_CONTEXT_LOST: u32 = 11;

/// Layout of one field, for the C header.
#[derive(Debug, Clone, Copy)]
pub struct CField {
    /// Field name.
    pub name: &'static str,
    /// C type, with `{}` where the name goes (for arrays).
    pub ctype: &'static str,
    /// Offset in the structure.
    pub offset: usize,
}

/// A structure that has a C twin.
pub trait CStruct {
    /// C name.
    const C_NAME: &'static str;
    /// Size in bytes.
    const SIZE: usize;
    /// Fields in declaration order.
    fn c_fields() -> Vec<CField>;
}

macro_rules! abi_struct {
    ($(#[$m:meta])* $name:ident => $cname:literal { $( $(#[$fm:meta])* $field:ident : $ty:ty => $cty:literal ),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq)]
        pub struct $name { $( $(#[$fm])* pub $field: $ty ),* }

        // SAFETY: repr(C) with only integer, float and integer-array fields,
        // and the assertion below proves there is no padding, so every byte
        // pattern is a valid value.
        unsafe impl ByteValued for $name {}

        const _: () = assert!(std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$ty>())*);

        impl CStruct for $name {
            const C_NAME: &'static str = $cname;
            const SIZE: usize = std::mem::size_of::<$name>();
            fn c_fields() -> Vec<CField> {
                vec![$( CField { name: stringify!($field), ctype: $cty, offset: std::mem::offset_of!($name, $field) } ),*]
            }
        }
    };
}

abi_struct!(
    /// An entry of the device error log.
    ErrorLogEntry => "vgpu_error_entry" {
        /// `ERR_*` code.
        code: u32 => "__u32 {}",
        /// Queue concerned, or 0xffffffff.
        queue: u32 => "__u32 {}",
        /// Code-specific detail (e.g. the faulting address).
        detail: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// First bytes of every command.
    CmdHeader => "vgpu_cmd_hdr" {
        /// `OP_*`.
        opcode: u32 => "__u32 {}",
        /// Opcode-specific flags in bits 0-15; the context in bits
        /// 16-31 ([`CMD_CTX_SHIFT`]).
        flags: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// FENCE: write `value` at guest address `addr` (8-byte aligned).
    FenceCmd => "vgpu_cmd_fence" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Guest address.
        addr: u64 => "__u64 {}",
        /// Value.
        value: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// WRITE_VALUE and WAIT_VALUE: the word at guest address `addr` and
    /// the value written or compared (its low half for a 32-bit word).
    ValueCmd => "vgpu_cmd_value" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Guest address.
        addr: u64 => "__u64 {}",
        /// Value.
        value: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MEM_ALLOC: result is the device address of the new allocation.
    MemAllocCmd => "vgpu_cmd_mem_alloc" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Bytes (non-zero).
        size: u64 => "__u64 {}",
        /// Alignment (power of two, 0 for the default of 256).
        align: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MEM_FREE: frees the allocation starting at `addr`.
    MemFreeCmd => "vgpu_cmd_mem_free" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Device address returned by MEM_ALLOC.
        addr: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// VA_RESERVE: reserves `size` bytes of device addresses (a multiple
    /// of [`VMM_GRANULARITY`], at most [`VMM_MAX_RESERVATION`]) aligned to
    /// `align` (0, or a power of two up to [`VMM_MAX_ALIGN`]; at least
    /// the granularity); `addr`, if not 0, is the address wanted, taken
    /// if it is free and aligned. Result: the range's first address.
    /// With [`VA_FLAG_FREE`], frees the reservation at `addr` of `size`.
    VaCmd => "vgpu_cmd_va" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Address wanted (0: any), or the reservation to free.
        addr: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
        /// Alignment (0: the granularity).
        align: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MEM_CREATE: a physical allocation of `size` bytes (a multiple of
    /// [`VMM_GRANULARITY`]), charged to the quota; result: its handle
    /// (not 0). With [`MEM_CREATE_FLAG_RELEASE`], releases `handle`.
    MemCreateCmd => "vgpu_cmd_mem_create" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Bytes (0 when releasing).
        size: u64 => "__u64 {}",
        /// The handle to release (0 when creating).
        handle: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MEM_MAP: maps `size` bytes of physical allocation `handle` from
    /// byte `offset` at `addr`, inside one reservation where nothing is
    /// mapped yet; all three multiples of [`VMM_GRANULARITY`]. A new
    /// mapping has no access ([`OP_MEM_ACCESS`]). With
    /// [`MEM_MAP_FLAG_UNMAP`], unmaps `[addr, addr + size)` (`handle` and
    /// `offset` 0).
    MemMapCmd => "vgpu_cmd_mem_map" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Device address.
        addr: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
        /// Physical allocation.
        handle: u64 => "__u64 {}",
        /// Offset in it.
        offset: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MEM_ACCESS: gives the whole mappings of `[addr, addr + size)`
    /// (every byte mapped) `access` (`MEM_ACCESS_*`).
    MemAccessCmd => "vgpu_cmd_mem_access" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Device address.
        addr: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
        /// `MEM_ACCESS_*`.
        access: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// COPY of `size` bytes. A `COPY_GUEST` side takes its scatter-gather
    /// list ([`SgEntry`] x `sg_count`) from the next device-readable
    /// descriptor; its `src`/`dst` is ignored.
    CopyCmd => "vgpu_cmd_copy" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// `COPY_*` kind of the source.
        src_kind: u32 => "__u32 {}",
        /// `COPY_*` kind of the destination.
        dst_kind: u32 => "__u32 {}",
        /// Source address (device address or window offset).
        src: u64 => "__u64 {}",
        /// Destination address (device address or window offset).
        dst: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
        /// Entries of the guest scatter-gather list.
        sg_count: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// ARRAY_CREATE: an array of `width` x `height` x `depth` elements of
    /// `channels` (1, 2 or 4) values of `format`; `height` 0 for 1D,
    /// `depth` 0 for 1D and 2D. Flags: `ARRAY_FLAG_*`.
    ArrayCmd => "vgpu_cmd_array" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// `FORMAT_*`.
        format: u32 => "__u32 {}",
        /// Channels: 1, 2 or 4.
        channels: u32 => "__u32 {}",
        /// Elements along x.
        width: u64 => "__u64 {}",
        /// Elements along y (0 for 1D).
        height: u64 => "__u64 {}",
        /// Elements along z, or layers (0 for 1D and 2D).
        depth: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// ARRAY_COPY of a box of `extent` (bytes, rows, slices) from `src`
    /// at `src_pos` (byte, row, slice) to `dst` at `dst_pos`. A side is
    /// an array handle (`ARRAY_COPY_*_ARRAY` flags) or a device address
    /// with its pitch (bytes between rows) and height (rows between
    /// slices); an array's pitch and height must be 0.
    ArrayCopyCmd => "vgpu_cmd_array_copy" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Source: array handle or device address.
        src: u64 => "__u64 {}",
        /// Destination: array handle or device address.
        dst: u64 => "__u64 {}",
        /// Source pitch, bytes.
        src_pitch: u32 => "__u32 {}",
        /// Source rows per slice.
        src_height: u32 => "__u32 {}",
        /// Destination pitch, bytes.
        dst_pitch: u32 => "__u32 {}",
        /// Destination rows per slice.
        dst_height: u32 => "__u32 {}",
        /// Source byte, row and slice.
        src_pos: [u32; 3] => "__u32 {}[3]",
        /// Destination byte, row and slice.
        dst_pos: [u32; 3] => "__u32 {}[3]",
        /// Bytes, rows and slices.
        extent: [u32; 3] => "__u32 {}[3]",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// OBJECT_CREATE: a texture (flags `OBJECT_TEXTURE`) or surface
    /// (`OBJECT_SURFACE`) object over `resource`; the result is the
    /// handle kernels pass to `tex`, `suld` and `sust`.
    ObjectCmd => "vgpu_cmd_object" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Array handle or device address.
        resource: u64 => "__u64 {}",
        /// Linear memory: bytes; pitched memory: the pitch; else 0.
        size: u64 => "__u64 {}",
        /// `RESOURCE_*`.
        res_type: u32 => "__u32 {}",
        /// Memory resources: `FORMAT_*`; else 0.
        format: u32 => "__u32 {}",
        /// Memory resources: channels; else 0.
        channels: u32 => "__u32 {}",
        /// Pitched memory: elements per row; else 0.
        width: u32 => "__u32 {}",
        /// Pitched memory: rows; else 0.
        height: u32 => "__u32 {}",
        /// Textures: `ADDRESS_*` of x, y and z, a byte each; else 0.
        address: u32 => "__u32 {}",
        /// Textures: `FILTER_*`; else 0.
        filter: u32 => "__u32 {}",
        /// Textures: `TEX_*` flags; else 0.
        tex_flags: u32 => "__u32 {}",
        /// Textures: the border colour's four channels; else 0.
        border: [f32; 4] => "float {}[4]",
    }
);

abi_struct!(
    /// OBJECT_DESTROY: the object (flags: `OBJECT_*`, its kind).
    ObjectDestroyCmd => "vgpu_cmd_object_destroy" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Handle ARRAY_CREATE or OBJECT_CREATE returned.
        handle: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// One guest memory segment of a COPY.
    SgEntry => "vgpu_sg_entry" {
        /// Guest address.
        addr: u64 => "__u64 {}",
        /// Bytes.
        len: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// FILL `size` bytes (a multiple of 4) at `addr` with `pattern`.
    FillCmd => "vgpu_cmd_fill" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Device address.
        addr: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
        /// 32-bit pattern.
        pattern: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// MODULE_LOAD: the image follows in the next device-readable
    /// descriptor(s); result is the module handle.
    ModuleLoadCmd => "vgpu_cmd_module_load" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// `MODULE_FORMAT_*`.
        format: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
        /// Bytes of the image.
        image_size: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// MODULE_UNLOAD.
    ModuleUnloadCmd => "vgpu_cmd_module_unload" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Handle from MODULE_LOAD.
        module: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// LAUNCH: the parameter block (`params_size` bytes) follows in the
    /// next device-readable descriptor. Flags: [`LAUNCH_FLAG_FUNCTION`].
    LaunchCmd => "vgpu_cmd_launch" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Module handle ([`MODULE_BUILTIN`] for the built-in one).
        module: u64 => "__u64 {}",
        /// Grid dimensions.
        grid: [u32; 3] => "__u32 {}[3]",
        /// Block dimensions.
        block: [u32; 3] => "__u32 {}[3]",
        /// Dynamic shared memory, bytes.
        shared_mem: u32 => "__u32 {}",
        /// Bytes of the parameter block.
        params_size: u32 => "__u32 {}",
        /// Entry point name, NUL-padded; a function handle under
        /// [`LAUNCH_FLAG_FUNCTION`].
        entry: [u8; 32] => "char {}[32]",
    }
);

abi_struct!(
    /// FUNC_INFO: the entry point's name (`name_len` bytes, no NUL) follows
    /// in the next device-readable descriptor(s). The device writes a
    /// [`FuncInfo`] and then [`FuncParam`] x `param_count` to device memory
    /// at `out` (as many as `out_size` bytes hold; the header says how many
    /// there are). Result: a non-zero function handle for
    /// [`LAUNCH_FLAG_FUNCTION`], the same for the same module and name,
    /// valid until the module is unloaded or the function reset.
    FuncInfoCmd => "vgpu_cmd_func_info" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Module handle.
        module: u64 => "__u64 {}",
        /// Device address of the result.
        out: u64 => "__u64 {}",
        /// Bytes at `out` (at least the size of [`FuncInfo`]).
        out_size: u32 => "__u32 {}",
        /// Bytes of the name, 1..=[`MAX_ENTRY_NAME`].
        name_len: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// OCCUPANCY: a launch shape of a function FUNC_INFO described.
    /// Result: the clusters of that shape that can be resident at once
    /// (0: none fits).
    OccupancyCmd => "vgpu_cmd_occupancy" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Module handle.
        module: u64 => "__u64 {}",
        /// Function handle FUNC_INFO returned for `module`.
        function: u64 => "__u64 {}",
        /// Block dimensions.
        block: [u32; 3] => "__u32 {}[3]",
        /// Dynamic shared memory per block, bytes.
        shared_mem: u32 => "__u32 {}",
        /// Blocks per cluster in x, y and z, each at least 1, at most
        /// [`MAX_OCCUPANCY_CLUSTER_BLOCKS`] in all.
        cluster: [u32; 3] => "__u32 {}[3]",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// CONSOLE: moves what the kernels of `module` printed, oldest first,
    /// to guest memory: `out_size` bytes given as a scatter-gather list of
    /// `sg_count` entries in the next device-readable descriptor, as
    /// COPY's guest side (the rest waits for the next CONSOLE). Guest
    /// memory, not device memory, so output printed before a fault that
    /// lost the device state still arrives. Result: the bytes written;
    /// [`Completion::result2`]: the bytes dropped since the last CONSOLE
    /// because the module's [`CONSOLE_BYTES`] were full.
    ConsoleCmd => "vgpu_cmd_console" {
        /// Header.
        hdr: CmdHeader => "struct vgpu_cmd_hdr {}",
        /// Module handle.
        module: u64 => "__u64 {}",
        /// Bytes of guest memory, 1..=[`CONSOLE_BYTES`].
        out_size: u32 => "__u32 {}",
        /// Entries of the scatter-gather list, 1..=[`MAX_SG_ENTRIES`].
        sg_count: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// What FUNC_INFO writes first: the kernel as the backend's driver
    /// describes it (`cuFuncGetAttribute`, `cuFuncGetParamInfo`).
    FuncInfo => "vgpu_func_info" {
        /// Parameters ([`FuncParam`] entries after this header).
        param_count: u32 => "__u32 {}",
        /// Bytes of the parameter block (end of the last parameter).
        params_size: u32 => "__u32 {}",
        /// Most threads per block.
        max_threads: u32 => "__u32 {}",
        /// Static shared memory, bytes.
        shared_static: u32 => "__u32 {}",
        /// Most dynamic shared memory per block a launch may ask for.
        max_dynamic_shared: u32 => "__u32 {}",
        /// Constant memory, bytes.
        const_bytes: u32 => "__u32 {}",
        /// Local memory per thread, bytes.
        local_bytes: u32 => "__u32 {}",
        /// Registers per thread.
        num_regs: u32 => "__u32 {}",
        /// PTX version the kernel was compiled for (major * 10 + minor).
        ptx_version: u32 => "__u32 {}",
        /// Binary architecture (major * 10 + minor).
        binary_version: u32 => "__u32 {}",
        /// Zero.
        reserved: [u32; 6] => "__u32 {}[6]",
    }
);

// Integers only: equality is total.
impl Eq for FuncInfo {}

abi_struct!(
    /// What FUNC_INFO of a global ([`FUNC_INFO_FLAG_GLOBAL`]) writes.
    GlobalInfo => "vgpu_global_info" {
        /// Device address.
        addr: u64 => "__u64 {}",
        /// Bytes.
        size: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// One parameter of a [`FuncInfo`].
    FuncParam => "vgpu_func_param" {
        /// Offset in the parameter block.
        offset: u32 => "__u32 {}",
        /// Bytes.
        size: u32 => "__u32 {}",
    }
);

impl Eq for FuncParam {}

abi_struct!(
    /// Written by the device to the last (device-writable) descriptor.
    Completion => "vgpu_completion" {
        /// `STATUS_*`.
        status: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
        /// Command result (device address, module handle, timestamp).
        result: u64 => "__u64 {}",
        /// Device time the command consumed, nanoseconds.
        device_ns: u64 => "__u64 {}",
        /// A second result (FUNC_INFO of a global: its size); else zero.
        result2: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// Built-in `fill_u32`: `count` 32-bit words at `dst` set to `value`.
    FillParams => "vgpu_fill_params" {
        /// Device address.
        dst: u64 => "__u64 {}",
        /// Words.
        count: u64 => "__u64 {}",
        /// Value.
        value: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// Built-in `copy`: `bytes` from `src` to `dst` (non-overlapping).
    CopyParams => "vgpu_copy_params" {
        /// Destination device address.
        dst: u64 => "__u64 {}",
        /// Source device address.
        src: u64 => "__u64 {}",
        /// Bytes.
        bytes: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// Built-in `vadd_f32`: `c[i] = a[i] + b[i]` for `n` floats.
    VaddParams => "vgpu_vadd_params" {
        /// Output.
        c: u64 => "__u64 {}",
        /// First input.
        a: u64 => "__u64 {}",
        /// Second input.
        b: u64 => "__u64 {}",
        /// Elements.
        n: u64 => "__u64 {}",
    }
);

abi_struct!(
    /// Built-in `saxpy_f32`: `y[i] = a * x[i] + y[i]` for `n` floats.
    SaxpyParams => "vgpu_saxpy_params" {
        /// In/out vector.
        y: u64 => "__u64 {}",
        /// Input vector.
        x: u64 => "__u64 {}",
        /// Elements.
        n: u64 => "__u64 {}",
        /// Scale.
        a: f32 => "float {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
    }
);

abi_struct!(
    /// Built-in `sgemm_f32`: `C = alpha * A * B + beta * C`, row-major,
    /// A is m x k, B is k x n, C is m x n.
    SgemmParams => "vgpu_sgemm_params" {
        /// C.
        c: u64 => "__u64 {}",
        /// A.
        a: u64 => "__u64 {}",
        /// B.
        b: u64 => "__u64 {}",
        /// Rows of A and C.
        m: u32 => "__u32 {}",
        /// Columns of B and C.
        n: u32 => "__u32 {}",
        /// Columns of A, rows of B.
        k: u32 => "__u32 {}",
        /// Zero.
        reserved: u32 => "__u32 {}",
        /// Scale of A * B.
        alpha: f32 => "float {}",
        /// Scale of C.
        beta: f32 => "float {}",
    }
);

abi_struct!(
    /// Built-in `reduce_sum_f32`: `out[0] = sum(input[0..n])`.
    ReduceSumParams => "vgpu_reduce_sum_params" {
        /// One float of output.
        out: u64 => "__u64 {}",
        /// Input vector.
        input: u64 => "__u64 {}",
        /// Elements.
        n: u64 => "__u64 {}",
    }
);

/// Entry points of the built-in module.
pub const BUILTIN_ENTRIES: [&str; 6] = [
    "fill_u32",
    "copy",
    "vadd_f32",
    "saxpy_f32",
    "sgemm_f32",
    "reduce_sum_f32",
];

/// Encodes an entry point name for [`LaunchCmd::entry`]; `None` if too long.
pub fn entry_name(name: &str) -> Option<[u8; 32]> {
    let bytes = name.as_bytes();
    if bytes.len() >= 32 || bytes.contains(&0) {
        return None;
    }
    let mut out = [0u8; 32];
    out[..bytes.len()].copy_from_slice(bytes);
    Some(out)
}

/// Encodes a function handle and cluster shape ([0; 3] or [1, 1, 1]:
/// none) for [`LaunchCmd::entry`] under [`LAUNCH_FLAG_FUNCTION`].
pub fn entry_function(handle: u64, cluster: [u32; 3]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out[..8].copy_from_slice(&handle.to_le_bytes());
    for (i, d) in cluster.iter().enumerate() {
        out[8 + 4 * i..12 + 4 * i].copy_from_slice(&d.to_le_bytes());
    }
    out
}

/// Decodes [`LaunchCmd::entry`] under [`LAUNCH_FLAG_FUNCTION`]: the
/// handle and the cluster shape (each dimension at least 1); `None` for a
/// zero handle or non-zero padding.
pub fn parse_entry_function(raw: &[u8; 32]) -> Option<(u64, [u32; 3])> {
    let word = |at: usize| u32::from_le_bytes([raw[at], raw[at + 1], raw[at + 2], raw[at + 3]]);
    let handle = u64::from_le_bytes(raw[..8].try_into().ok()?);
    let cluster = [word(8), word(12), word(16)].map(|d| d.max(1));
    (handle != 0 && raw[20..].iter().all(|&b| b == 0)).then_some((handle, cluster))
}

/// Decodes [`LaunchCmd::entry`]; `None` unless NUL-terminated UTF-8.
pub fn parse_entry_name(raw: &[u8; 32]) -> Option<&str> {
    let end = raw.iter().position(|b| *b == 0)?;
    std::str::from_utf8(&raw[..end]).ok()
}

fn c_struct<T: CStruct>(out: &mut String, kernel_visible: bool) {
    if !kernel_visible {
        out.push_str("#ifndef __KERNEL__\n");
    }
    let _ = writeln!(out, "struct {} {{", T::C_NAME);
    for f in T::c_fields() {
        let decl = f.ctype.replace("{}", f.name);
        let _ = writeln!(out, "\t{decl}; /* offset {} */", f.offset);
    }
    out.push_str("};\n\n");
    let _ = writeln!(
        out,
        "_Static_assert(sizeof(struct {}) == {}, \"{} layout\");",
        T::C_NAME,
        T::SIZE,
        T::C_NAME
    );
    if !kernel_visible {
        out.push_str("#endif\n");
    }
    out.push('\n');
}

/// The C header for the guest kernel module and C programs, generated
/// from the definitions above.
pub fn c_header() -> String {
    let mut o = String::new();
    o.push_str(
        "/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR Apache-2.0 */\n\
         /*\n * vgpud virtual GPU function: guest ABI.\n *\n\
         \x20* Generated from crates/vgpu-abi/src/lib.rs by\n\
         \x20* `cargo run -p vgpu-abi --example gen-header`; do not edit.\n */\n\
         #ifndef VGPU_ABI_H\n#define VGPU_ABI_H\n\n\
         #include <linux/types.h>\n\n",
    );
    let defs: &[(&str, u64)] = &[
        ("VGPU_PCI_VENDOR_ID", PCI_VENDOR_ID.into()),
        ("VGPU_PCI_DEVICE_ID", PCI_DEVICE_ID.into()),
        (
            "VGPU_PCI_SUBSYSTEM_VENDOR_ID",
            PCI_SUBSYSTEM_VENDOR_ID.into(),
        ),
        ("VGPU_PCI_SUBSYSTEM_ID", PCI_SUBSYSTEM_ID.into()),
        ("VGPU_PCI_CLASS", PCI_CLASS.into()),
        ("VGPU_PCI_REVISION", PCI_REVISION.into()),
        ("VGPU_ABI_MAGIC", ABI_MAGIC.into()),
        ("VGPU_ABI_VERSION_MAJOR", ABI_VERSION_MAJOR.into()),
        ("VGPU_ABI_VERSION_MINOR", ABI_VERSION_MINOR.into()),
        ("VGPU_BAR_REGS", BAR_REGS.into()),
        ("VGPU_BAR_WINDOW", BAR_WINDOW.into()),
        ("VGPU_BAR0_SIZE", BAR0_SIZE),
        ("VGPU_MAX_QUEUES", MAX_QUEUES.into()),
        ("VGPU_MAX_QUEUE_SIZE", MAX_QUEUE_SIZE.into()),
        ("VGPU_MSIX_ERROR_VECTOR", MSIX_ERROR_VECTOR.into()),
        ("VGPU_MSIX_VECTORS", MSIX_VECTORS.into()),
        ("VGPU_MSIX_NO_VECTOR", MSIX_NO_VECTOR.into()),
        ("VGPU_REG_MAGIC", REG_MAGIC),
        ("VGPU_REG_VERSION", REG_VERSION),
        ("VGPU_REG_FEATURES", REG_FEATURES),
        ("VGPU_REG_MEM_SIZE", REG_MEM_SIZE),
        ("VGPU_REG_COMPUTE_UNITS", REG_COMPUTE_UNITS),
        ("VGPU_REG_MAX_QUEUES", REG_MAX_QUEUES),
        ("VGPU_REG_WINDOW_SIZE", REG_WINDOW_SIZE),
        ("VGPU_REG_MAX_QUEUE_SIZE", REG_MAX_QUEUE_SIZE),
        ("VGPU_REG_DOORBELL_OFFSET", REG_DOORBELL_OFFSET),
        ("VGPU_REG_CONTROL", REG_CONTROL),
        ("VGPU_REG_STATUS", REG_STATUS),
        ("VGPU_REG_IRQ_CAUSE", REG_IRQ_CAUSE),
        ("VGPU_REG_IRQ_MASK", REG_IRQ_MASK),
        ("VGPU_REG_WAKE", REG_WAKE),
        ("VGPU_REG_ERROR_COUNT", REG_ERROR_COUNT),
        ("VGPU_REG_MEM_USED", REG_MEM_USED),
        ("VGPU_REG_BUSY_NS", REG_BUSY_NS),
        ("VGPU_REG_COMMANDS", REG_COMMANDS),
        ("VGPU_REG_MAX_CONTEXTS", REG_MAX_CONTEXTS),
        ("VGPU_REG_CONTEXTS", REG_CONTEXTS),
        ("VGPU_REG_CONTEXT_COST", REG_CONTEXT_COST),
        ("VGPU_ERROR_LOG_OFFSET", ERROR_LOG_OFFSET),
        ("VGPU_ERROR_LOG_ENTRIES", ERROR_LOG_ENTRIES.into()),
        ("VGPU_QUEUE_REGS_OFFSET", QUEUE_REGS_OFFSET),
        ("VGPU_QUEUE_REGS_STRIDE", QUEUE_REGS_STRIDE),
        ("VGPU_QREG_SIZE", QREG_SIZE),
        ("VGPU_QREG_CONTROL", QREG_CONTROL),
        ("VGPU_QREG_STATUS", QREG_STATUS),
        ("VGPU_QREG_ERROR", QREG_ERROR),
        ("VGPU_QREG_DESC", QREG_DESC),
        ("VGPU_QREG_AVAIL", QREG_AVAIL),
        ("VGPU_QREG_USED", QREG_USED),
        ("VGPU_QREG_MSIX_VECTOR", QREG_MSIX_VECTOR),
        ("VGPU_DOORBELL_OFFSET", DOORBELL_OFFSET),
        ("VGPU_DOORBELL_SIZE", DOORBELL_SIZE),
        ("VGPU_DOORBELL_STRIDE", DOORBELL_STRIDE),
        ("VGPU_DB_AVAIL_IDX", DB_AVAIL_IDX),
        ("VGPU_DB_POLLING", DB_POLLING),
        ("VGPU_MSIX_TABLE_OFFSET", MSIX_TABLE_OFFSET),
        ("VGPU_MSIX_PBA_OFFSET", MSIX_PBA_OFFSET),
        ("VGPU_FEATURE_EVENT_IDX", FEATURE_EVENT_IDX),
        ("VGPU_FEATURE_POLLED", FEATURE_POLLED),
        ("VGPU_FEATURE_WINDOW", FEATURE_WINDOW),
        ("VGPU_FEATURE_TIMESTAMP", FEATURE_TIMESTAMP),
        ("VGPU_FEATURE_FUNC_INFO", FEATURE_FUNC_INFO),
        ("VGPU_FEATURE_OCCUPANCY", FEATURE_OCCUPANCY),
        ("VGPU_FEATURE_CONSOLE", FEATURE_CONSOLE),
        ("VGPU_FEATURE_VALUES", FEATURE_VALUES),
        ("VGPU_FEATURE_CONTEXTS", FEATURE_CONTEXTS),
        ("VGPU_FEATURE_COOPERATIVE", FEATURE_COOPERATIVE),
        ("VGPU_FEATURE_VMM", FEATURE_VMM),
        ("VGPU_FEATURE_ARRAYS", FEATURE_ARRAYS),
        ("VGPU_FEATURE_RESIZE", FEATURE_RESIZE),
        ("VGPU_CONTROL_ENABLE", CONTROL_ENABLE.into()),
        ("VGPU_CONTROL_RESET", CONTROL_RESET.into()),
        ("VGPU_STATUS_ENABLED", STATUS_ENABLED.into()),
        ("VGPU_STATUS_FATAL", STATUS_FATAL.into()),
        ("VGPU_IRQ_CAUSE_QUEUE", IRQ_CAUSE_QUEUE.into()),
        ("VGPU_IRQ_CAUSE_ERROR", IRQ_CAUSE_ERROR.into()),
        ("VGPU_IRQ_CAUSE_CONFIG", IRQ_CAUSE_CONFIG.into()),
        ("VGPU_QCONTROL_ENABLE", QCONTROL_ENABLE.into()),
        ("VGPU_QCONTROL_POLLED", QCONTROL_POLLED.into()),
        ("VGPU_QSTATUS_ENABLED", QSTATUS_ENABLED.into()),
        ("VGPU_QSTATUS_ERROR", QSTATUS_ERROR.into()),
        ("VGPU_ERR_NONE", ERR_NONE.into()),
        ("VGPU_ERR_RING_ADDRESS", ERR_RING_ADDRESS.into()),
        ("VGPU_ERR_RING_CORRUPT", ERR_RING_CORRUPT.into()),
        ("VGPU_ERR_QUEUE_CONFIG", ERR_QUEUE_CONFIG.into()),
        ("VGPU_ERR_REGISTER", ERR_REGISTER.into()),
        ("VGPU_ERR_BACKEND", ERR_BACKEND.into()),
        ("VGPU_OP_NOP", OP_NOP.into()),
        ("VGPU_OP_FENCE", OP_FENCE.into()),
        ("VGPU_OP_MEM_ALLOC", OP_MEM_ALLOC.into()),
        ("VGPU_OP_MEM_FREE", OP_MEM_FREE.into()),
        ("VGPU_OP_COPY", OP_COPY.into()),
        ("VGPU_OP_FILL", OP_FILL.into()),
        ("VGPU_OP_MODULE_LOAD", OP_MODULE_LOAD.into()),
        ("VGPU_OP_MODULE_UNLOAD", OP_MODULE_UNLOAD.into()),
        ("VGPU_OP_LAUNCH", OP_LAUNCH.into()),
        ("VGPU_OP_TIMESTAMP", OP_TIMESTAMP.into()),
        ("VGPU_OP_FUNC_INFO", OP_FUNC_INFO.into()),
        ("VGPU_OP_OCCUPANCY", OP_OCCUPANCY.into()),
        ("VGPU_OP_CONSOLE", OP_CONSOLE.into()),
        ("VGPU_OP_WRITE_VALUE", OP_WRITE_VALUE.into()),
        ("VGPU_OP_WAIT_VALUE", OP_WAIT_VALUE.into()),
        ("VGPU_OP_CTX_DESTROY", OP_CTX_DESTROY.into()),
        ("VGPU_OP_VA_RESERVE", OP_VA_RESERVE.into()),
        ("VGPU_OP_MEM_CREATE", OP_MEM_CREATE.into()),
        ("VGPU_OP_MEM_MAP", OP_MEM_MAP.into()),
        ("VGPU_OP_MEM_ACCESS", OP_MEM_ACCESS.into()),
        ("VGPU_OP_ARRAY_CREATE", OP_ARRAY_CREATE.into()),
        ("VGPU_OP_ARRAY_COPY", OP_ARRAY_COPY.into()),
        ("VGPU_OP_OBJECT_CREATE", OP_OBJECT_CREATE.into()),
        ("VGPU_OP_OBJECT_DESTROY", OP_OBJECT_DESTROY.into()),
        ("VGPU_CMD_CTX_SHIFT", CMD_CTX_SHIFT.into()),
        ("VGPU_CMD_CTX_MASK", CMD_CTX_MASK.into()),
        ("VGPU_MAX_CONTEXT_ID", MAX_CONTEXT_ID.into()),
        ("VGPU_FENCE_FLAG_IRQ", FENCE_FLAG_IRQ.into()),
        ("VGPU_VALUE_FLAG_32", VALUE_FLAG_32.into()),
        ("VGPU_WAIT_GEQ", WAIT_GEQ.into()),
        ("VGPU_WAIT_EQ", WAIT_EQ.into()),
        ("VGPU_WAIT_AND", WAIT_AND.into()),
        ("VGPU_WAIT_NOR", WAIT_NOR.into()),
        ("VGPU_WAIT_COND_MASK", WAIT_COND_MASK.into()),
        ("VGPU_LAUNCH_FLAG_FUNCTION", LAUNCH_FLAG_FUNCTION.into()),
        (
            "VGPU_LAUNCH_FLAG_COOPERATIVE",
            LAUNCH_FLAG_COOPERATIVE.into(),
        ),
        ("VGPU_FUNC_INFO_FLAG_GLOBAL", FUNC_INFO_FLAG_GLOBAL.into()),
        ("VGPU_VA_FLAG_FREE", VA_FLAG_FREE.into()),
        (
            "VGPU_MEM_CREATE_FLAG_RELEASE",
            MEM_CREATE_FLAG_RELEASE.into(),
        ),
        ("VGPU_MEM_MAP_FLAG_UNMAP", MEM_MAP_FLAG_UNMAP.into()),
        ("VGPU_MEM_ACCESS_NONE", MEM_ACCESS_NONE.into()),
        ("VGPU_MEM_ACCESS_READ", MEM_ACCESS_READ.into()),
        ("VGPU_MEM_ACCESS_READ_WRITE", MEM_ACCESS_READ_WRITE.into()),
        ("VGPU_VMM_GRANULARITY", VMM_GRANULARITY),
        ("VGPU_VMM_MAX_RESERVATION", VMM_MAX_RESERVATION),
        ("VGPU_VMM_MAX_ALIGN", VMM_MAX_ALIGN),
        ("VGPU_VMM_MAX_RESERVATIONS", VMM_MAX_RESERVATIONS),
        ("VGPU_VMM_MAX_OBJECTS", VMM_MAX_OBJECTS),
        ("VGPU_MODULE_FLAG_PRINTS", MODULE_FLAG_PRINTS),
        ("VGPU_ARRAY_FLAG_LAYERED", ARRAY_FLAG_LAYERED.into()),
        ("VGPU_ARRAY_FLAG_SURFACE", ARRAY_FLAG_SURFACE.into()),
        ("VGPU_ARRAY_FLAG_CUBEMAP", ARRAY_FLAG_CUBEMAP.into()),
        ("VGPU_ARRAY_COPY_SRC_ARRAY", ARRAY_COPY_SRC_ARRAY.into()),
        ("VGPU_ARRAY_COPY_DST_ARRAY", ARRAY_COPY_DST_ARRAY.into()),
        ("VGPU_OBJECT_ARRAY", OBJECT_ARRAY.into()),
        ("VGPU_OBJECT_TEXTURE", OBJECT_TEXTURE.into()),
        ("VGPU_OBJECT_SURFACE", OBJECT_SURFACE.into()),
        ("VGPU_CONSOLE_BYTES", CONSOLE_BYTES.into()),
        ("VGPU_MAX_ENTRY_NAME", MAX_ENTRY_NAME.into()),
        ("VGPU_MAX_FUNC_PARAMS", MAX_FUNC_PARAMS.into()),
        ("VGPU_MAX_FUNCTIONS", MAX_FUNCTIONS.into()),
        ("VGPU_MAX_CLUSTER_BLOCKS", MAX_CLUSTER_BLOCKS.into()),
        (
            "VGPU_MAX_OCCUPANCY_CLUSTER_BLOCKS",
            MAX_OCCUPANCY_CLUSTER_BLOCKS.into(),
        ),
        ("VGPU_COPY_GUEST", COPY_GUEST.into()),
        ("VGPU_COPY_DEVICE", COPY_DEVICE.into()),
        ("VGPU_COPY_WINDOW", COPY_WINDOW.into()),
        ("VGPU_MAX_SG_ENTRIES", MAX_SG_ENTRIES.into()),
        ("VGPU_MAX_PARAMS_SIZE", MAX_PARAMS_SIZE.into()),
        ("VGPU_MAX_MODULE_SIZE", MAX_MODULE_SIZE),
        ("VGPU_ALLOC_DEFAULT_ALIGN", ALLOC_DEFAULT_ALIGN),
        ("VGPU_ALLOC_MAX_ALIGN", ALLOC_MAX_ALIGN),
        ("VGPU_MAX_ALLOCATIONS", MAX_ALLOCATIONS),
        ("VGPU_MODULE_FORMAT_PTX", MODULE_FORMAT_PTX.into()),
        ("VGPU_MODULE_FORMAT_FATBIN", MODULE_FORMAT_FATBIN.into()),
        ("VGPU_MODULE_FORMAT_CUBIN", MODULE_FORMAT_CUBIN.into()),
        ("VGPU_MODULE_BUILTIN", MODULE_BUILTIN),
        ("VGPU_STATUS_OK", STATUS_OK.into()),
        ("VGPU_STATUS_INVALID", STATUS_INVALID.into()),
        ("VGPU_STATUS_FAULT", STATUS_FAULT.into()),
        ("VGPU_STATUS_NO_MEMORY", STATUS_NO_MEMORY.into()),
        ("VGPU_STATUS_UNSUPPORTED", STATUS_UNSUPPORTED.into()),
        ("VGPU_STATUS_NOT_FOUND", STATUS_NOT_FOUND.into()),
        ("VGPU_STATUS_CANCELLED", STATUS_CANCELLED.into()),
        ("VGPU_STATUS_OUT_OF_RANGE", STATUS_OUT_OF_RANGE.into()),
        ("VGPU_STATUS_DEVICE_ERROR", STATUS_DEVICE_ERROR.into()),
        ("VGPU_STATUS_KERNEL_FAULT", STATUS_KERNEL_FAULT.into()),
        ("VGPU_STATUS_KERNEL_ASSERT", STATUS_KERNEL_ASSERT.into()),
        ("VGPU_STATUS_CONTEXT_LOST", STATUS_CONTEXT_LOST.into()),
    ];
    for (name, value) in defs {
        let _ = writeln!(o, "#define {name} 0x{value:x}ULL");
    }
    o.push('\n');
    c_struct::<ErrorLogEntry>(&mut o, true);
    c_struct::<CmdHeader>(&mut o, true);
    c_struct::<FenceCmd>(&mut o, true);
    c_struct::<ValueCmd>(&mut o, true);
    c_struct::<MemAllocCmd>(&mut o, true);
    c_struct::<MemFreeCmd>(&mut o, true);
    c_struct::<VaCmd>(&mut o, true);
    c_struct::<MemCreateCmd>(&mut o, true);
    c_struct::<MemMapCmd>(&mut o, true);
    c_struct::<MemAccessCmd>(&mut o, true);
    c_struct::<CopyCmd>(&mut o, true);
    c_struct::<SgEntry>(&mut o, true);
    c_struct::<ArrayCmd>(&mut o, true);
    c_struct::<ArrayCopyCmd>(&mut o, true);
    c_struct::<ObjectCmd>(&mut o, true);
    c_struct::<ObjectDestroyCmd>(&mut o, true);
    c_struct::<FillCmd>(&mut o, true);
    c_struct::<ModuleLoadCmd>(&mut o, true);
    c_struct::<ModuleUnloadCmd>(&mut o, true);
    c_struct::<LaunchCmd>(&mut o, true);
    c_struct::<FuncInfoCmd>(&mut o, true);
    c_struct::<OccupancyCmd>(&mut o, true);
    c_struct::<ConsoleCmd>(&mut o, true);
    c_struct::<FuncInfo>(&mut o, true);
    c_struct::<FuncParam>(&mut o, true);
    c_struct::<GlobalInfo>(&mut o, true);
    c_struct::<Completion>(&mut o, true);
    // Float parameter blocks are for user space only.
    c_struct::<FillParams>(&mut o, false);
    c_struct::<CopyParams>(&mut o, false);
    c_struct::<VaddParams>(&mut o, false);
    c_struct::<SaxpyParams>(&mut o, false);
    c_struct::<SgemmParams>(&mut o, false);
    c_struct::<ReduceSumParams>(&mut o, false);
    o.push_str("#endif /* VGPU_ABI_H */\n");
    o
}

// The BAR0 layout must not overlap itself.
const _: () = {
    assert!(queue_reg(MAX_QUEUES, 0) <= DOORBELL_OFFSET);
    assert!(doorbell(MAX_QUEUES, 0) <= DOORBELL_SIZE);
    assert!(ERROR_LOG_OFFSET + ERROR_LOG_ENTRIES as u64 * 16 <= QUEUE_REGS_OFFSET);
    assert!(MSIX_TABLE_OFFSET + MSIX_VECTORS as u64 * 16 <= MSIX_PBA_OFFSET);
    assert!(MSIX_PBA_OFFSET < BAR0_SIZE);
    assert!(REG_CONTEXTS + 4 <= REG_CONTEXT_COST);
    assert!(REG_CONTEXT_COST + 8 <= ERROR_LOG_OFFSET);
};

/// Offset in BAR0 of register `reg` of queue `queue`.
pub const fn queue_reg(queue: u32, reg: u64) -> u64 {
    QUEUE_REGS_OFFSET + queue as u64 * QUEUE_REGS_STRIDE + reg
}

/// Offset in the doorbell page of field `field` of queue `queue`.
pub const fn doorbell(queue: u32, field: u64) -> u64 {
    queue as u64 * DOORBELL_STRIDE + field
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn header_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest-driver/include/vgpu_abi.h")
    }

    #[test]
    fn test_c_header_is_identical_to_generated() {
        let committed = std::fs::read_to_string(header_path()).expect("header missing");
        assert!(
            committed == c_header(),
            "guest-driver/include/vgpu_abi.h is stale: run `cargo run -p vgpu-abi --example gen-header`"
        );
    }

    #[test]
    fn test_c_header_compiles_with_matching_layout() {
        // The header carries _Static_asserts of every struct size; gcc
        // checks them against the C compiler's own layout rules.
        let dir = std::env::temp_dir().join(format!("vgpu-abi-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("check.c");
        let mut checks = String::from("#include \"vgpu_abi.h\"\n#include <stddef.h>\n");
        macro_rules! offsets {
            ($($t:ty),*) => {$(
                for f in <$t>::c_fields() {
                    checks.push_str(&format!(
                        "_Static_assert(offsetof(struct {}, {}) == {}, \"{}\");\n",
                        <$t>::C_NAME, f.name, f.offset, f.name
                    ));
                }
            )*};
        }
        offsets!(
            ErrorLogEntry,
            CmdHeader,
            FenceCmd,
            ValueCmd,
            MemAllocCmd,
            MemFreeCmd,
            VaCmd,
            MemCreateCmd,
            MemMapCmd,
            MemAccessCmd,
            CopyCmd,
            SgEntry,
            ArrayCmd,
            ArrayCopyCmd,
            ObjectCmd,
            ObjectDestroyCmd,
            FillCmd,
            ModuleLoadCmd,
            ModuleUnloadCmd,
            LaunchCmd,
            FuncInfoCmd,
            OccupancyCmd,
            ConsoleCmd,
            Completion,
            FillParams,
            CopyParams,
            VaddParams,
            SaxpyParams,
            SgemmParams,
            ReduceSumParams
        );
        std::fs::write(&src, checks).unwrap();
        let include = header_path().parent().unwrap().to_path_buf();
        let out = std::process::Command::new("gcc")
            .args(["-fsyntax-only", "-Wall", "-Werror", "-std=c11", "-I"])
            .arg(&include)
            .arg(&src)
            .output()
            .expect("gcc is needed for this test");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn test_entry_names() {
        let raw = entry_name("saxpy_f32").unwrap();
        assert_eq!(parse_entry_name(&raw), Some("saxpy_f32"));
        assert!(entry_name(&"x".repeat(32)).is_none());
        assert!(parse_entry_name(&[b'a'; 32]).is_none());
    }

    #[test]
    fn test_entry_function_handles() {
        assert_eq!(
            parse_entry_function(&entry_function(7, [0; 3])),
            Some((7, [1, 1, 1]))
        );
        assert_eq!(
            parse_entry_function(&entry_function(7, [2, 1, 4])),
            Some((7, [2, 1, 4]))
        );
        assert_eq!(parse_entry_function(&entry_function(0, [1; 3])), None);
        let mut raw = entry_function(7, [1; 3]);
        raw[31] = 1;
        assert_eq!(parse_entry_function(&raw), None);
    }
}
