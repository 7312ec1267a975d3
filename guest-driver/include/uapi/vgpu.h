/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * User interface of the vgpu guest driver: one character device per
 * virtual GPU function, /dev/vgpu<N>.
 *
 * Every structure has explicit padding, 64-bit fields on 8-byte offsets
 * and user pointers as __u64, so 32-bit and 64-bit processes share the
 * layout. Reserved and padding fields must be zero on input; the driver
 * writes zero to reserved output fields. See guest-driver/README.md for
 * the full semantics of each ioctl.
 */
#ifndef _UAPI_VGPU_H
#define _UAPI_VGPU_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define VGPU_UAPI_VERSION		1

/* Limits enforced by the driver. */
#define VGPU_MAX_BATCH_CMDS		256		/* commands per SUBMIT */
#define VGPU_MAX_COPY_BYTES		(64ULL << 20)	/* per COPY with a user side */
#define VGPU_MAX_BATCH_PIN_BYTES	(256ULL << 20)	/* user memory pinned per SUBMIT */
#define VGPU_MAX_IMAGE_BYTES		(16ULL << 20)	/* MODULE_LOAD image */
#define VGPU_MAX_PARAMS_BYTES		32764		/* LAUNCH parameter block */
#define VGPU_MAX_BATCH_STAGED_BYTES	(32ULL << 20)	/* images + params per SUBMIT */
#define VGPU_MAX_UNCOLLECTED		1024		/* uncollected fences per file */
#define VGPU_ENTRY_NAME_LEN		32
#define VGPU_MAX_FUNC_NAME_BYTES	4096		/* FUNC_INFO entry name */
#define VGPU_MAX_PINNED_RANGES		256		/* PIN ranges per file */

#define VGPU_TIMEOUT_INFINITE		(~0ULL)

/* ---- VGPU_IOCTL_INFO ---------------------------------------------------- */

#define VGPU_INFO_POLLED	(1U << 0)	/* queues are polled by the device */
#define VGPU_INFO_MSIX		(1U << 1)	/* MSI-X interrupts (else INTx) */
#define VGPU_INFO_WINDOW	(1U << 2)	/* the window can be mmap()ed */
#define VGPU_INFO_FUNC_INFO	(1U << 3)	/* VGPU_CMD_FUNC_INFO, launch by function */
#define VGPU_INFO_OCCUPANCY	(1U << 4)	/* VGPU_CMD_OCCUPANCY */
#define VGPU_INFO_CONSOLE	(1U << 5)	/* VGPU_CMD_CONSOLE, VGPU_MODULE_PRINTS */
#define VGPU_INFO_CONTEXTS	(1U << 6)	/* a device context per open file */
#define VGPU_INFO_VMM		(1U << 7)	/* VGPU_IOCTL_VMM */

/**
 * struct vgpu_info - what VGPU_IOCTL_INFO reports of the function
 * @uapi_version: VGPU_UAPI_VERSION
 * @abi_version: device VERSION register: major << 16 | minor
 * @vendor_id: PCI vendor ID
 * @device_id: PCI device ID
 * @subsystem_vendor_id: PCI subsystem vendor ID
 * @subsystem_id: PCI subsystem ID
 * @revision: PCI revision ID
 * @pci_bus: PCI bus number
 * @pci_devfn: PCI device and function number
 * @pad0: zero
 * @pci_domain: PCI domain number
 * @features: device FEATURES register
 * @mem_size: device memory of the partition, bytes
 * @window_size: host-visible window (BAR2), bytes
 * @compute_units: compute units of the partition
 * @max_queues: queues the device offers
 * @queues: queues the driver uses
 * @queue_size: ring entries per queue
 * @flags: VGPU_INFO_*
 * @minor: N of /dev/vgpuN
 * @max_contexts: with VGPU_INFO_CONTEXTS, the contexts the function may
 *	have at once (the device's MAX_CONTEXTS); else 0
 * @pad1: zero
 * @context_cost: device memory each context holds of its own while it
 *	lives (device CONTEXT_COST), counted in the function's memory in
 *	use; 0 where contexts cost nothing
 * @reserved: zero
 */
struct vgpu_info {
	__u32 uapi_version;
	__u32 abi_version;
	__u16 vendor_id;
	__u16 device_id;
	__u16 subsystem_vendor_id;
	__u16 subsystem_id;
	__u8 revision;
	__u8 pci_bus;
	__u8 pci_devfn;
	__u8 pad0;
	__u32 pci_domain;
	__u64 features;
	__u64 mem_size;
	__u64 window_size;
	__u32 compute_units;
	__u32 max_queues;
	__u32 queues;
	__u32 queue_size;
	__u32 flags;
	__u32 minor;
	__u32 max_contexts;
	__u32 pad1;
	__u64 context_cost;
	__u64 reserved[2];
};

/* ---- VGPU_IOCTL_ALLOC / VGPU_IOCTL_FREE ---------------------------------- */

/**
 * struct vgpu_alloc - argument of VGPU_IOCTL_ALLOC
 * @size: in: bytes, > 0
 * @align: in: power of two, 0 for the device default
 * @addr: out: device address
 * @flags: in: 0
 * @pad: zero
 */
struct vgpu_alloc {
	__u64 size;
	__u64 align;
	__u64 addr;
	__u32 flags;
	__u32 pad;
};

/**
 * struct vgpu_free - argument of VGPU_IOCTL_FREE
 * @addr: in: address returned by ALLOC
 */
struct vgpu_free {
	__u64 addr;
};

/* ---- VGPU_IOCTL_SUBMIT: commands ------------------------------------------ */

/* Opcodes (the device's numbering; 2 and 3 are ALLOC/FREE ioctls). */
#define VGPU_CMD_NOP		0
#define VGPU_CMD_FENCE		1
#define VGPU_CMD_COPY		4
#define VGPU_CMD_FILL		5
#define VGPU_CMD_MODULE_LOAD	6
#define VGPU_CMD_MODULE_UNLOAD	7
#define VGPU_CMD_LAUNCH		8
#define VGPU_CMD_TIMESTAMP	9
#define VGPU_CMD_FUNC_INFO	10
#define VGPU_CMD_OCCUPANCY	11
#define VGPU_CMD_CONSOLE	12
#define VGPU_CMD_WRITE_VALUE	13
#define VGPU_CMD_WAIT_VALUE	14
#define VGPU_CMD_ARRAY_CREATE	20	/* a CUDA array; @result its handle */
#define VGPU_CMD_ARRAY_COPY	21	/* a box between arrays and device memory */
#define VGPU_CMD_OBJECT_CREATE	22	/* a texture or surface object */
#define VGPU_CMD_OBJECT_DESTROY	23	/* an array, texture or surface object */

/* Bit of a MODULE_LOAD's @result2: its kernels may print (VGPU_CMD_CONSOLE). */
#define VGPU_MODULE_PRINTS	(1ULL << 0)
#define VGPU_MAX_CONSOLE_BYTES	(1U << 20)	/* CONSOLE @out_size */

/* vgpu_cmd.flags of FENCE, LAUNCH and FUNC_INFO; others take 0. */
#define VGPU_CMD_FENCE_IRQ	(1U << 0)
#define VGPU_CMD_LAUNCH_FUNCTION	(1U << 0)	/* launch by function handle */
#define VGPU_CMD_LAUNCH_COOPERATIVE	(1U << 1)	/* every block resident */
#define VGPU_CMD_FUNC_INFO_GLOBAL	(1U << 0)	/* FUNC_INFO of a global */
#define VGPU_CMD_VALUE_32	(1U << 0)	/* WRITE/WAIT_VALUE: a 32-bit word */
#define VGPU_CMD_WAIT_GEQ	(0U << 1)	/* (s64)(word - value) >= 0 */
#define VGPU_CMD_WAIT_EQ	(1U << 1)	/* word == value */
#define VGPU_CMD_WAIT_AND	(2U << 1)	/* (word & value) != 0 */
#define VGPU_CMD_WAIT_NOR	(3U << 1)	/* ~(word | value) != 0 */
#define VGPU_CMD_ARRAY_LAYERED	(1U << 0)	/* ARRAY_CREATE: depth counts layers */
#define VGPU_CMD_ARRAY_SURFACE	(1U << 1)	/* ARRAY_CREATE: surfaces may be made */
#define VGPU_CMD_ARRAY_CUBEMAP	(1U << 2)	/* ARRAY_CREATE: six square faces */
#define VGPU_CMD_COPY_SRC_ARRAY	(1U << 0)	/* ARRAY_COPY: @src is an array */
#define VGPU_CMD_COPY_DST_ARRAY	(1U << 1)	/* ARRAY_COPY: @dst is an array */
#define VGPU_OBJ_ARRAY		0	/* OBJECT_DESTROY flags: an array */
#define VGPU_OBJ_TEXTURE	1	/* OBJECT_CREATE/DESTROY flags: a texture */
#define VGPU_OBJ_SURFACE	2	/* OBJECT_CREATE/DESTROY flags: a surface */

/* Memory kinds of a COPY side. */
#define VGPU_MEM_USER		0	/* this process's memory: a user address */
#define VGPU_MEM_DEVICE		1	/* device memory: an address from ALLOC */
#define VGPU_MEM_WINDOW		2	/* window (BAR2): a byte offset */

/**
 * struct vgpu_copy_args - a VGPU_CMD_COPY
 * @src_kind: VGPU_MEM_* of @src
 * @dst_kind: VGPU_MEM_* of @dst
 * @src: where to copy from, as its kind says
 * @dst: where to copy to, as its kind says
 * @size: bytes, > 0
 */
struct vgpu_copy_args {
	__u32 src_kind;
	__u32 dst_kind;
	__u64 src;
	__u64 dst;
	__u64 size;
};

/**
 * struct vgpu_fill_args - a VGPU_CMD_FILL
 * @addr: device address
 * @size: bytes, a multiple of 4, > 0
 * @pattern: 32-bit little-endian pattern
 * @pad: zero
 */
struct vgpu_fill_args {
	__u64 addr;
	__u64 size;
	__u32 pattern;
	__u32 pad;
};

#define VGPU_MODULE_PTX	1
#define VGPU_MODULE_FATBIN	2
#define VGPU_MODULE_CUBIN	3

/**
 * struct vgpu_module_load_args - a VGPU_CMD_MODULE_LOAD
 * @format: VGPU_MODULE_PTX, VGPU_MODULE_FATBIN (a CUDA fatbinary) or
 *          VGPU_MODULE_CUBIN (an ELF cubin)
 * @pad: zero
 * @image: user pointer to the image
 * @image_size: bytes, 1..VGPU_MAX_IMAGE_BYTES
 */
struct vgpu_module_load_args {
	__u32 format;
	__u32 pad;
	__u64 image;
	__u64 image_size;
};

#define VGPU_MODULE_BUILTIN_ID	0

/**
 * struct vgpu_module_unload_args - a VGPU_CMD_MODULE_UNLOAD
 * @module: handle from a MODULE_LOAD of this file
 */
struct vgpu_module_unload_args {
	__u64 module;
};

/**
 * struct vgpu_func_info_args - a VGPU_CMD_FUNC_INFO
 * @module: a handle from a MODULE_LOAD of this file
 * @out: device address (of this file's memory) the description goes to:
 *	a struct vgpu_func_info, then struct vgpu_func_param entries, as
 *	many as @out_size holds (the header gives their number)
 * @out_size: bytes at @out, at least sizeof(struct vgpu_func_info)
 * @name_len: bytes at @name, 1..VGPU_MAX_FUNC_NAME_BYTES, no NUL
 * @name: user pointer to the entry point's name
 *
 * @result is the function handle a VGPU_CMD_LAUNCH_FUNCTION launch takes.
 * With VGPU_CMD_FUNC_INFO_GLOBAL, @name is a global variable of the
 * module: a struct vgpu_global_info goes to @out, @result is its device
 * address and @result2 its size, and the global is memory of the file
 * (COPY and FILL reach it, FREE refuses it) until its module is unloaded.
 */
struct vgpu_func_info_args {
	__u64 module;
	__u64 out;
	__u32 out_size;
	__u32 name_len;
	__u64 name;
};

/**
 * struct vgpu_occupancy_args - a VGPU_CMD_OCCUPANCY
 * @module: a handle from a MODULE_LOAD of this file
 * @function: a function handle from VGPU_CMD_FUNC_INFO of @module
 * @block: threads per block in x, y and z
 * @shared_mem: dynamic shared memory per block, bytes
 * @cluster: blocks per thread block cluster in x, y and z, each at least 1
 * @pad: zero
 *
 * @result is how many clusters of this shape the device can hold at
 * once, as the host's driver counts them (0: none fits).
 */
struct vgpu_occupancy_args {
	__u64 module;
	__u64 function;
	__u32 block[3];
	__u32 shared_mem;
	__u32 cluster[3];
	__u32 pad;
};

/**
 * struct vgpu_console_args - a VGPU_CMD_CONSOLE
 * @module: a handle from a MODULE_LOAD of this file
 * @out: user pointer the output goes to
 * @out_size: bytes at @out, 1..VGPU_MAX_CONSOLE_BYTES
 * @pad: zero
 *
 * Moves what the kernels of @module printed (printf in device code),
 * oldest first, to @out. @result is the bytes written (fewer than
 * @out_size: nothing more waits), @result2 the bytes the device dropped
 * since the last CONSOLE of @module because its buffer was full.
 */
struct vgpu_console_args {
	__u64 module;
	__u64 out;
	__u32 out_size;
	__u32 pad;
};

/**
 * struct vgpu_value_args - a VGPU_CMD_WRITE_VALUE or VGPU_CMD_WAIT_VALUE
 * @addr: user address of the word, 8-byte aligned (4 with
 *	VGPU_CMD_VALUE_32), inside a range pinned with VGPU_IOCTL_PIN
 * @value: the value written, or compared as the flags' condition says
 *	(the low half for a 32-bit word)
 *
 * WRITE_VALUE writes the word once the queue's earlier commands are
 * done; WAIT_VALUE holds the file's later commands until the word meets
 * the condition (another file's WRITE_VALUE, or a CPU store, meets it).
 * Other files' commands go on meanwhile.
 */
struct vgpu_value_args {
	__u64 addr;
	__u64 value;
};

/**
 * struct vgpu_array_args - a VGPU_CMD_ARRAY_CREATE
 * @format: element type, CUDA's CUarray_format number
 * @channels: 1, 2 or 4
 * @width: elements along x
 * @height: elements along y (0: 1D)
 * @depth: elements along z or layers (0: 1D or 2D)
 *
 * The device's struct vgpu_cmd_array after its header; so are the
 * three below. Arrays and objects are the file's device context's own
 * (they need VGPU_INFO_CONTEXTS): the device refuses another context's
 * handles and addresses, and frees them with the context.
 */
struct vgpu_array_args {
	__u32 format;
	__u32 channels;
	__u64 width;
	__u64 height;
	__u64 depth;
};

/**
 * struct vgpu_array_copy_args - a VGPU_CMD_ARRAY_COPY
 * @src: array handle or device address
 * @dst: array handle or device address
 * @src_pitch: device memory: bytes per row (0 for an array)
 * @src_height: device memory: rows per slice (0 for an array)
 * @dst_pitch: as @src_pitch
 * @dst_height: as @src_height
 * @src_pos: byte, row and slice where the box starts
 * @dst_pos: as @src_pos
 * @extent: bytes, rows and slices of the box
 * @pad: zero
 */
struct vgpu_array_copy_args {
	__u64 src;
	__u64 dst;
	__u32 src_pitch;
	__u32 src_height;
	__u32 dst_pitch;
	__u32 dst_height;
	__u32 src_pos[3];
	__u32 dst_pos[3];
	__u32 extent[3];
	__u32 pad;
};

/**
 * struct vgpu_object_args - a VGPU_CMD_OBJECT_CREATE (flags: the kind)
 * @resource: array handle or device address
 * @size: linear memory: bytes; pitched memory: the pitch; else 0
 * @res_type: 0 an array, 1 linear memory, 2 pitched memory
 * @format: memory: CUarray_format; else 0
 * @channels: memory: channels; else 0
 * @width: pitched memory: elements per row
 * @height: pitched memory: rows
 * @address: textures: address modes of x, y, z (a byte each)
 * @filter: textures: 0 point, 1 linear
 * @tex_flags: textures: CU_TRSF_READ_AS_INTEGER, CU_TRSF_NORMALIZED_COORDINATES
 * @border: textures: the border colour (IEEE single bits)
 */
struct vgpu_object_args {
	__u64 resource;
	__u64 size;
	__u32 res_type;
	__u32 format;
	__u32 channels;
	__u32 width;
	__u32 height;
	__u32 address;
	__u32 filter;
	__u32 tex_flags;
	__u32 border[4];
};

/**
 * struct vgpu_object_destroy_args - a VGPU_CMD_OBJECT_DESTROY (flags:
 *	the kind)
 * @handle: from ARRAY_CREATE or OBJECT_CREATE
 */
struct vgpu_object_destroy_args {
	__u64 handle;
};

/**
 * struct vgpu_launch_args - a VGPU_CMD_LAUNCH
 * @module: VGPU_MODULE_BUILTIN_ID or a handle from a MODULE_LOAD
 * @grid: blocks in x, y and z
 * @block: threads per block in x, y and z
 * @shared_mem: dynamic shared memory, bytes
 * @params_size: bytes at @params, 0..VGPU_MAX_PARAMS_BYTES
 * @params: user pointer to the parameter block
 * @entry: NUL-terminated entry point; with VGPU_CMD_LAUNCH_FUNCTION, a
 *	function handle from VGPU_CMD_FUNC_INFO of @module (8 bytes), the
 *	blocks per thread block cluster in x, y and z (3 x __u32; zeros: no
 *	clusters), the rest zero; all little-endian
 */
struct vgpu_launch_args {
	__u64 module;
	__u32 grid[3];
	__u32 block[3];
	__u32 shared_mem;
	__u32 params_size;
	__u64 params;
	char entry[VGPU_ENTRY_NAME_LEN];
};

/* Result statuses (the device's completion statuses). */
#define VGPU_CMD_STATUS_OK		0
#define VGPU_CMD_STATUS_INVALID		1	/* -EINVAL */
#define VGPU_CMD_STATUS_FAULT		2	/* -EFAULT */
#define VGPU_CMD_STATUS_NO_MEMORY	3	/* -ENOMEM */
#define VGPU_CMD_STATUS_UNSUPPORTED	4	/* -EOPNOTSUPP */
#define VGPU_CMD_STATUS_NOT_FOUND	5	/* -ENOENT */
#define VGPU_CMD_STATUS_CANCELLED	6	/* -EIO, -ENODEV: failed by the driver */
#define VGPU_CMD_STATUS_OUT_OF_RANGE	7	/* -ERANGE */
#define VGPU_CMD_STATUS_DEVICE_ERROR	8	/* -EIO */
#define VGPU_CMD_STATUS_KERNEL_FAULT	9	/* -EIO: a kernel's illegal address */
#define VGPU_CMD_STATUS_KERNEL_ASSERT	10	/* -EIO: a kernel's failed assert() */
#define VGPU_CMD_STATUS_CONTEXT_LOST	11	/* -ENOTRECOVERABLE: a fault ended the context */

/**
 * struct vgpu_cmd - one command of a VGPU_IOCTL_SUBMIT batch
 * @opcode: in: VGPU_CMD_*
 * @flags: in: per opcode, see above
 * @copy: in: arguments of VGPU_CMD_COPY
 * @fill: in: arguments of VGPU_CMD_FILL
 * @module_load: in: arguments of VGPU_CMD_MODULE_LOAD
 * @module_unload: in: arguments of VGPU_CMD_MODULE_UNLOAD
 * @launch: in: arguments of VGPU_CMD_LAUNCH
 * @func_info: in: arguments of VGPU_CMD_FUNC_INFO
 * @occupancy: in: arguments of VGPU_CMD_OCCUPANCY
 * @console: in: arguments of VGPU_CMD_CONSOLE
 * @value: in: arguments of VGPU_CMD_WRITE_VALUE and VGPU_CMD_WAIT_VALUE
 * @array: in: arguments of VGPU_CMD_ARRAY_CREATE
 * @array_copy: in: arguments of VGPU_CMD_ARRAY_COPY
 * @object: in: arguments of VGPU_CMD_OBJECT_CREATE
 * @object_destroy: in: arguments of VGPU_CMD_OBJECT_DESTROY
 * @raw: the arguments as words; bytes the opcode does not use must be zero
 * @status: out: VGPU_CMD_STATUS_*
 * @error: out: 0 or a negative errno matching @status
 * @result: out: MODULE_LOAD: the handle; FUNC_INFO: the function handle;
 *	TIMESTAMP: device ns; OCCUPANCY: resident clusters; CONSOLE: bytes;
 *	ARRAY_CREATE, OBJECT_CREATE: the handle
 * @device_ns: out: device time the command took
 * @result2: out: FUNC_INFO of a global: its size; MODULE_LOAD:
 *	VGPU_MODULE_PRINTS; CONSOLE: bytes dropped; else zero
 *
 * The out fields are written by a waiting SUBMIT or by WAIT. Flags an
 * opcode does not define are refused with -EINVAL: the device context a
 * command runs in is not the caller's to name, the driver adds it.
 */
struct vgpu_cmd {
	__u32 opcode;
	__u32 flags;
	union {
		struct vgpu_copy_args copy;
		struct vgpu_fill_args fill;
		struct vgpu_module_load_args module_load;
		struct vgpu_module_unload_args module_unload;
		struct vgpu_launch_args launch;
		struct vgpu_func_info_args func_info;
		struct vgpu_occupancy_args occupancy;
		struct vgpu_console_args console;
		struct vgpu_value_args value;
		struct vgpu_array_args array;
		struct vgpu_array_copy_args array_copy;
		struct vgpu_object_args object;
		struct vgpu_object_destroy_args object_destroy;
		__u64 raw[11];
	};
	__u32 status;
	__s32 error;
	__u64 result;
	__u64 device_ns;
	__u64 result2;
};

/* ---- VGPU_IOCTL_SUBMIT / VGPU_IOCTL_WAIT -------------------------------- */

#define VGPU_SUBMIT_WAIT	(1U << 0)	/* wait, write results, collect */

#define VGPU_NO_INDEX		0xffffffffU

/**
 * struct vgpu_submit - argument of VGPU_IOCTL_SUBMIT
 * @cmds: in: user pointer to struct vgpu_cmd[@count]
 * @count: in: 1..VGPU_MAX_BATCH_CMDS
 * @flags: in: VGPU_SUBMIT_*
 * @timeout_ns: in: with VGPU_SUBMIT_WAIT, as in struct vgpu_wait
 * @fence: out: fence of the batch (1, 2, 3, ...)
 * @error_index: out: offending or first failed command
 * @error: out: with VGPU_SUBMIT_WAIT, the batch outcome
 */
struct vgpu_submit {
	__u64 cmds;
	__u32 count;
	__u32 flags;
	__u64 timeout_ns;
	__u64 fence;
	__u32 error_index;
	__s32 error;
};

#define VGPU_WAIT_ALL		(1U << 0)	/* also collect earlier fences */

/**
 * struct vgpu_wait - argument of VGPU_IOCTL_WAIT
 * @fence: in: the fence to wait for
 * @timeout_ns: in: 0 polls; VGPU_TIMEOUT_INFINITE
 * @cmds: in: user pointer for results, or 0
 * @count: in: entries at @cmds (the batch's count)
 * @flags: in: VGPU_WAIT_*
 * @error_fence: out: fence of the first failed command, or 0
 * @error_index: out: its index, or VGPU_NO_INDEX
 * @error: out: its errno, or 0
 */
struct vgpu_wait {
	__u64 fence;
	__u64 timeout_ns;
	__u64 cmds;
	__u32 count;
	__u32 flags;
	__u64 error_fence;
	__u32 error_index;
	__s32 error;
};

/* ---- VGPU_IOCTL_USAGE ----------------------------------------------------- */

/**
 * struct vgpu_usage - what VGPU_IOCTL_USAGE reports
 * @mem_used: device MEM_USED: all files of the function
 * @busy_ns: device BUSY_NS
 * @commands: device COMMANDS
 * @file_mem_used: bytes allocated through this file
 * @file_allocs: allocations of this file
 * @file_modules: modules loaded by this file
 * @file_inflight: batches of this file on the device
 * @file_uncollected: fences of this file not yet collected
 * @open_files: open files of the function
 * @processes: distinct processes that opened them
 * @device_errors: device ERROR_COUNT
 * @recoveries: queue and function resets by the driver
 * @context: the device context of this file (its owner's for a lane);
 *	0 without VGPU_INFO_CONTEXTS
 * @contexts: device CONTEXTS: contexts the function has now
 * @context_pending: what this file's context will hold of its own once
 *	it starts (its first command that needs device state: not a FENCE,
 *	WRITE_VALUE or WAIT_VALUE), not yet in @mem_used: the device's
 *	CONTEXT_COST before then, 0 after and without contexts. Free
 *	memory, as this file can allocate it, is
 *	mem_size - mem_used - context_pending.
 * @mem_size: device MEM_SIZE now: the quota, which a live resize
 *	changes (VGPU_INFO's is the size at the last resize the driver
 *	heard of); 0 from drivers that predate it
 * @reserved: zero
 */
struct vgpu_usage {
	__u64 mem_used;
	__u64 busy_ns;
	__u64 commands;
	__u64 file_mem_used;
	__u32 file_allocs;
	__u32 file_modules;
	__u32 file_inflight;
	__u32 file_uncollected;
	__u32 open_files;
	__u32 processes;
	__u32 device_errors;
	__u32 recoveries;
	__u32 context;
	__u32 contexts;
	__u64 context_pending;
	__u64 mem_size;
	__u64 reserved;
};

/* ---- VGPU_IOCTL_PIN / VGPU_IOCTL_UNPIN ----------------------------------- */

/**
 * struct vgpu_pin - argument of VGPU_IOCTL_PIN and VGPU_IOCTL_UNPIN
 * @addr: in: start of the range, page-aligned (UNPIN: as given to PIN)
 * @size: in: bytes, a multiple of the page size (UNPIN: 0)
 *
 * PIN pins a range of the caller's memory and maps it for the device
 * once; a later COPY whose user side lies inside it uses that mapping
 * instead of pinning its pages itself. The range must stay mapped until
 * UNPIN (or close): copies of a range unmapped meanwhile reach the pages
 * that were pinned, not what is mapped there now. Ranges of a file do not
 * overlap; at most VGPU_MAX_PINNED_RANGES, and at most half the memory.
 */
struct vgpu_pin {
	__u64 addr;
	__u64 size;
};

/* ---- VGPU_IOCTL_LANE -------------------------------------------------------- */

/**
 * struct vgpu_lane - argument of VGPU_IOCTL_LANE
 * @fd: in: an open file of the same function, itself no lane
 * @queue: out: the queue this file's commands now go to
 *
 * Makes a freshly opened file (nothing submitted, allocated, loaded or
 * pinned) a lane of @fd's file: its commands go to another queue of the
 * function, in order among themselves and side by side with the other
 * file's, and use that file's device memory, modules and pinned ranges.
 * A lane takes COPY, FILL, LAUNCH, TIMESTAMP, NOP, FENCE, WRITE_VALUE and
 * WAIT_VALUE; ALLOC, FREE, PIN, UNPIN and the other commands go to the
 * file that owns the resources (-EINVAL here). Where the function has
 * fewer queues than files, lanes share them.
 */
struct vgpu_lane {
	__s32 fd;
	__u32 queue;
};

/* ---- VGPU_IOCTL_VMM --------------------------------------------------------- */

/* Operations of VGPU_IOCTL_VMM (virtual memory management). */
#define VGPU_VMM_RESERVE	0	/* reserve device addresses */
#define VGPU_VMM_FREE		1	/* free a reservation */
#define VGPU_VMM_CREATE		2	/* make a physical allocation */
#define VGPU_VMM_RELEASE	3	/* release a physical allocation */
#define VGPU_VMM_MAP		4	/* map a physical allocation */
#define VGPU_VMM_UNMAP		5	/* unmap whole mappings */
#define VGPU_VMM_ACCESS		6	/* set the access of whole mappings */

/* Access of a mapping (VGPU_VMM_ACCESS), CUDA's CU_MEM_ACCESS_FLAGS_PROT_*. */
#define VGPU_VMM_ACCESS_NONE	0
#define VGPU_VMM_ACCESS_READ	1
#define VGPU_VMM_ACCESS_RW	3

/* What addresses, sizes and offsets are multiples of. */
#define VGPU_VMM_GRANULE	(2ULL << 20)

/**
 * struct vgpu_vmm - argument of VGPU_IOCTL_VMM
 * @op: in: VGPU_VMM_*
 * @access: in: ACCESS: VGPU_VMM_ACCESS_*; else zero
 * @addr: in: RESERVE: the address wanted (0: any); FREE: the reservation;
 *	MAP, UNMAP, ACCESS: the first address of the range.
 *	out: RESERVE: the reservation's first address
 * @size: in: bytes, a multiple of VGPU_VMM_GRANULE (RELEASE: zero)
 * @align: in: RESERVE: 0 or a power of two; else zero
 * @handle: in: RELEASE, MAP: a physical allocation of this file; else
 *	zero. out: CREATE: the new physical allocation
 * @offset: in: MAP: where in @handle the mapping starts, a multiple of
 *	VGPU_VMM_GRANULE; else zero
 *
 * The device's virtual memory management (VGPU_INFO_VMM; -EOPNOTSUPP
 * without it). A file names only what it made itself: its own
 * reservations and physical allocations, and MAP only into its own
 * reservation; UNMAP and ACCESS take a range made of whole mappings of
 * the file. COPY, FILL and FUNC_INFO reach mapped memory of the file,
 * also across mappings side by side, once ACCESS allowed it; FREE does
 * not free it. What the file holds goes with it on close. Lanes take
 * none of these (-EINVAL).
 */
struct vgpu_vmm {
	__u32 op;
	__u32 access;
	__u64 addr;
	__u64 size;
	__u64 align;
	__u64 handle;
	__u64 offset;
};

/* ---- ioctl numbers -------------------------------------------------------- */

#define VGPU_IOCTL_MAGIC	'V'

#define VGPU_IOCTL_INFO		_IOR(VGPU_IOCTL_MAGIC, 0xa0, struct vgpu_info)
#define VGPU_IOCTL_ALLOC	_IOWR(VGPU_IOCTL_MAGIC, 0xa1, struct vgpu_alloc)
#define VGPU_IOCTL_FREE		_IOW(VGPU_IOCTL_MAGIC, 0xa2, struct vgpu_free)
#define VGPU_IOCTL_SUBMIT	_IOWR(VGPU_IOCTL_MAGIC, 0xa3, struct vgpu_submit)
#define VGPU_IOCTL_WAIT		_IOWR(VGPU_IOCTL_MAGIC, 0xa4, struct vgpu_wait)
#define VGPU_IOCTL_USAGE	_IOR(VGPU_IOCTL_MAGIC, 0xa5, struct vgpu_usage)
#define VGPU_IOCTL_PIN		_IOW(VGPU_IOCTL_MAGIC, 0xa6, struct vgpu_pin)
#define VGPU_IOCTL_UNPIN	_IOW(VGPU_IOCTL_MAGIC, 0xa7, struct vgpu_pin)
#define VGPU_IOCTL_LANE		_IOWR(VGPU_IOCTL_MAGIC, 0xa8, struct vgpu_lane)
#define VGPU_IOCTL_VMM		_IOWR(VGPU_IOCTL_MAGIC, 0xa9, struct vgpu_vmm)

#endif /* _UAPI_VGPU_H */
