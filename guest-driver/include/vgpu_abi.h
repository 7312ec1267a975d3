/* SPDX-License-Identifier: (GPL-2.0 WITH Linux-syscall-note) OR Apache-2.0 */
/*
 * vgpud virtual GPU function: guest ABI.
 *
 * Generated from crates/vgpu-abi/src/lib.rs by
 * `cargo run -p vgpu-abi --example gen-header`; do not edit.
 */
#ifndef VGPU_ABI_H
#define VGPU_ABI_H

#include <linux/types.h>

#define VGPU_PCI_VENDOR_ID 0x1ee7ULL
#define VGPU_PCI_DEVICE_ID 0x100ULL
#define VGPU_PCI_SUBSYSTEM_VENDOR_ID 0x1ee7ULL
#define VGPU_PCI_SUBSYSTEM_ID 0x1ULL
#define VGPU_PCI_CLASS 0x30200ULL
#define VGPU_PCI_REVISION 0x1ULL
#define VGPU_ABI_MAGIC 0x55504756ULL
#define VGPU_ABI_VERSION_MAJOR 0x1ULL
#define VGPU_ABI_VERSION_MINOR 0x8ULL
#define VGPU_BAR_REGS 0x0ULL
#define VGPU_BAR_WINDOW 0x2ULL
#define VGPU_BAR0_SIZE 0x4000ULL
#define VGPU_MAX_QUEUES 0x10ULL
#define VGPU_MAX_QUEUE_SIZE 0x400ULL
#define VGPU_MSIX_ERROR_VECTOR 0x0ULL
#define VGPU_MSIX_VECTORS 0x11ULL
#define VGPU_MSIX_NO_VECTOR 0xffffULL
#define VGPU_REG_MAGIC 0x0ULL
#define VGPU_REG_VERSION 0x4ULL
#define VGPU_REG_FEATURES 0x8ULL
#define VGPU_REG_MEM_SIZE 0x10ULL
#define VGPU_REG_COMPUTE_UNITS 0x18ULL
#define VGPU_REG_MAX_QUEUES 0x1cULL
#define VGPU_REG_WINDOW_SIZE 0x20ULL
#define VGPU_REG_MAX_QUEUE_SIZE 0x28ULL
#define VGPU_REG_DOORBELL_OFFSET 0x2cULL
#define VGPU_REG_CONTROL 0x30ULL
#define VGPU_REG_STATUS 0x34ULL
#define VGPU_REG_IRQ_CAUSE 0x38ULL
#define VGPU_REG_IRQ_MASK 0x3cULL
#define VGPU_REG_WAKE 0x40ULL
#define VGPU_REG_ERROR_COUNT 0x44ULL
#define VGPU_REG_MEM_USED 0x48ULL
#define VGPU_REG_BUSY_NS 0x50ULL
#define VGPU_REG_COMMANDS 0x58ULL
#define VGPU_REG_MAX_CONTEXTS 0x60ULL
#define VGPU_REG_CONTEXTS 0x64ULL
#define VGPU_REG_CONTEXT_COST 0x68ULL
#define VGPU_ERROR_LOG_OFFSET 0x100ULL
#define VGPU_ERROR_LOG_ENTRIES 0x10ULL
#define VGPU_QUEUE_REGS_OFFSET 0x400ULL
#define VGPU_QUEUE_REGS_STRIDE 0x40ULL
#define VGPU_QREG_SIZE 0x0ULL
#define VGPU_QREG_CONTROL 0x4ULL
#define VGPU_QREG_STATUS 0x8ULL
#define VGPU_QREG_ERROR 0xcULL
#define VGPU_QREG_DESC 0x10ULL
#define VGPU_QREG_AVAIL 0x18ULL
#define VGPU_QREG_USED 0x20ULL
#define VGPU_QREG_MSIX_VECTOR 0x28ULL
#define VGPU_DOORBELL_OFFSET 0x1000ULL
#define VGPU_DOORBELL_SIZE 0x1000ULL
#define VGPU_DOORBELL_STRIDE 0x40ULL
#define VGPU_DB_AVAIL_IDX 0x0ULL
#define VGPU_DB_POLLING 0x4ULL
#define VGPU_MSIX_TABLE_OFFSET 0x2000ULL
#define VGPU_MSIX_PBA_OFFSET 0x3000ULL
#define VGPU_FEATURE_EVENT_IDX 0x1ULL
#define VGPU_FEATURE_POLLED 0x2ULL
#define VGPU_FEATURE_WINDOW 0x4ULL
#define VGPU_FEATURE_TIMESTAMP 0x8ULL
#define VGPU_FEATURE_FUNC_INFO 0x10ULL
#define VGPU_FEATURE_OCCUPANCY 0x20ULL
#define VGPU_FEATURE_CONSOLE 0x40ULL
#define VGPU_FEATURE_VALUES 0x80ULL
#define VGPU_FEATURE_CONTEXTS 0x100ULL
#define VGPU_FEATURE_COOPERATIVE 0x200ULL
#define VGPU_FEATURE_VMM 0x400ULL
#define VGPU_FEATURE_ARRAYS 0x800ULL
#define VGPU_FEATURE_RESIZE 0x1000ULL
#define VGPU_CONTROL_ENABLE 0x1ULL
#define VGPU_CONTROL_RESET 0x2ULL
#define VGPU_STATUS_ENABLED 0x1ULL
#define VGPU_STATUS_FATAL 0x2ULL
#define VGPU_IRQ_CAUSE_QUEUE 0x1ULL
#define VGPU_IRQ_CAUSE_ERROR 0x2ULL
#define VGPU_IRQ_CAUSE_CONFIG 0x4ULL
#define VGPU_QCONTROL_ENABLE 0x1ULL
#define VGPU_QCONTROL_POLLED 0x2ULL
#define VGPU_QSTATUS_ENABLED 0x1ULL
#define VGPU_QSTATUS_ERROR 0x2ULL
#define VGPU_ERR_NONE 0x0ULL
#define VGPU_ERR_RING_ADDRESS 0x1ULL
#define VGPU_ERR_RING_CORRUPT 0x2ULL
#define VGPU_ERR_QUEUE_CONFIG 0x3ULL
#define VGPU_ERR_REGISTER 0x4ULL
#define VGPU_ERR_BACKEND 0x5ULL
#define VGPU_OP_NOP 0x0ULL
#define VGPU_OP_FENCE 0x1ULL
#define VGPU_OP_MEM_ALLOC 0x2ULL
#define VGPU_OP_MEM_FREE 0x3ULL
#define VGPU_OP_COPY 0x4ULL
#define VGPU_OP_FILL 0x5ULL
#define VGPU_OP_MODULE_LOAD 0x6ULL
#define VGPU_OP_MODULE_UNLOAD 0x7ULL
#define VGPU_OP_LAUNCH 0x8ULL
#define VGPU_OP_TIMESTAMP 0x9ULL
#define VGPU_OP_FUNC_INFO 0xaULL
#define VGPU_OP_OCCUPANCY 0xbULL
#define VGPU_OP_CONSOLE 0xcULL
#define VGPU_OP_WRITE_VALUE 0xdULL
#define VGPU_OP_WAIT_VALUE 0xeULL
#define VGPU_OP_CTX_DESTROY 0xfULL
#define VGPU_OP_VA_RESERVE 0x10ULL
#define VGPU_OP_MEM_CREATE 0x11ULL
#define VGPU_OP_MEM_MAP 0x12ULL
#define VGPU_OP_MEM_ACCESS 0x13ULL
#define VGPU_OP_ARRAY_CREATE 0x14ULL
#define VGPU_OP_ARRAY_COPY 0x15ULL
#define VGPU_OP_OBJECT_CREATE 0x16ULL
#define VGPU_OP_OBJECT_DESTROY 0x17ULL
#define VGPU_CMD_CTX_SHIFT 0x10ULL
#define VGPU_CMD_CTX_MASK 0xffff0000ULL
#define VGPU_MAX_CONTEXT_ID 0xffffULL
#define VGPU_FENCE_FLAG_IRQ 0x1ULL
#define VGPU_VALUE_FLAG_32 0x1ULL
#define VGPU_WAIT_GEQ 0x0ULL
#define VGPU_WAIT_EQ 0x2ULL
#define VGPU_WAIT_AND 0x4ULL
#define VGPU_WAIT_NOR 0x6ULL
#define VGPU_WAIT_COND_MASK 0x6ULL
#define VGPU_LAUNCH_FLAG_FUNCTION 0x1ULL
#define VGPU_LAUNCH_FLAG_COOPERATIVE 0x2ULL
#define VGPU_FUNC_INFO_FLAG_GLOBAL 0x1ULL
#define VGPU_VA_FLAG_FREE 0x1ULL
#define VGPU_MEM_CREATE_FLAG_RELEASE 0x1ULL
#define VGPU_MEM_MAP_FLAG_UNMAP 0x1ULL
#define VGPU_MEM_ACCESS_NONE 0x0ULL
#define VGPU_MEM_ACCESS_READ 0x1ULL
#define VGPU_MEM_ACCESS_READ_WRITE 0x3ULL
#define VGPU_VMM_GRANULARITY 0x200000ULL
#define VGPU_VMM_MAX_RESERVATION 0x100000000000ULL
#define VGPU_VMM_MAX_ALIGN 0x10000000000ULL
#define VGPU_VMM_MAX_RESERVATIONS 0x1000ULL
#define VGPU_VMM_MAX_OBJECTS 0x10000ULL
#define VGPU_MODULE_FLAG_PRINTS 0x1ULL
#define VGPU_ARRAY_FLAG_LAYERED 0x1ULL
#define VGPU_ARRAY_FLAG_SURFACE 0x2ULL
#define VGPU_ARRAY_FLAG_CUBEMAP 0x4ULL
#define VGPU_ARRAY_COPY_SRC_ARRAY 0x1ULL
#define VGPU_ARRAY_COPY_DST_ARRAY 0x2ULL
#define VGPU_OBJECT_ARRAY 0x0ULL
#define VGPU_OBJECT_TEXTURE 0x1ULL
#define VGPU_OBJECT_SURFACE 0x2ULL
#define VGPU_CONSOLE_BYTES 0x100000ULL
#define VGPU_MAX_ENTRY_NAME 0x1000ULL
#define VGPU_MAX_FUNC_PARAMS 0x400ULL
#define VGPU_MAX_FUNCTIONS 0x10000ULL
#define VGPU_MAX_CLUSTER_BLOCKS 0x10ULL
#define VGPU_MAX_OCCUPANCY_CLUSTER_BLOCKS 0x40ULL
#define VGPU_COPY_GUEST 0x0ULL
#define VGPU_COPY_DEVICE 0x1ULL
#define VGPU_COPY_WINDOW 0x2ULL
#define VGPU_MAX_SG_ENTRIES 0x100ULL
#define VGPU_MAX_PARAMS_SIZE 0x7ffcULL
#define VGPU_MAX_MODULE_SIZE 0x1000000ULL
#define VGPU_ALLOC_DEFAULT_ALIGN 0x100ULL
#define VGPU_ALLOC_MAX_ALIGN 0x40000000ULL
#define VGPU_MAX_ALLOCATIONS 0x10000ULL
#define VGPU_MODULE_FORMAT_PTX 0x1ULL
#define VGPU_MODULE_FORMAT_FATBIN 0x2ULL
#define VGPU_MODULE_FORMAT_CUBIN 0x3ULL
#define VGPU_MODULE_BUILTIN 0x0ULL
#define VGPU_STATUS_OK 0x0ULL
#define VGPU_STATUS_INVALID 0x1ULL
#define VGPU_STATUS_FAULT 0x2ULL
#define VGPU_STATUS_NO_MEMORY 0x3ULL
#define VGPU_STATUS_UNSUPPORTED 0x4ULL
#define VGPU_STATUS_NOT_FOUND 0x5ULL
#define VGPU_STATUS_CANCELLED 0x6ULL
#define VGPU_STATUS_OUT_OF_RANGE 0x7ULL
#define VGPU_STATUS_DEVICE_ERROR 0x8ULL
#define VGPU_STATUS_KERNEL_FAULT 0x9ULL
#define VGPU_STATUS_KERNEL_ASSERT 0xaULL
#define VGPU_STATUS_CONTEXT_LOST 0xbULL

struct vgpu_error_entry {
	__u32 code; /* offset 0 */
	__u32 queue; /* offset 4 */
	__u64 detail; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_error_entry) == 16, "vgpu_error_entry layout");

struct vgpu_cmd_hdr {
	__u32 opcode; /* offset 0 */
	__u32 flags; /* offset 4 */
};

_Static_assert(sizeof(struct vgpu_cmd_hdr) == 8, "vgpu_cmd_hdr layout");

struct vgpu_cmd_fence {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 value; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_cmd_fence) == 24, "vgpu_cmd_fence layout");

struct vgpu_cmd_value {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 value; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_cmd_value) == 24, "vgpu_cmd_value layout");

struct vgpu_cmd_mem_alloc {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 size; /* offset 8 */
	__u64 align; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_cmd_mem_alloc) == 24, "vgpu_cmd_mem_alloc layout");

struct vgpu_cmd_mem_free {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_cmd_mem_free) == 16, "vgpu_cmd_mem_free layout");

struct vgpu_cmd_va {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 size; /* offset 16 */
	__u64 align; /* offset 24 */
};

_Static_assert(sizeof(struct vgpu_cmd_va) == 32, "vgpu_cmd_va layout");

struct vgpu_cmd_mem_create {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 size; /* offset 8 */
	__u64 handle; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_cmd_mem_create) == 24, "vgpu_cmd_mem_create layout");

struct vgpu_cmd_mem_map {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 size; /* offset 16 */
	__u64 handle; /* offset 24 */
	__u64 offset; /* offset 32 */
};

_Static_assert(sizeof(struct vgpu_cmd_mem_map) == 40, "vgpu_cmd_mem_map layout");

struct vgpu_cmd_mem_access {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 size; /* offset 16 */
	__u32 access; /* offset 24 */
	__u32 reserved; /* offset 28 */
};

_Static_assert(sizeof(struct vgpu_cmd_mem_access) == 32, "vgpu_cmd_mem_access layout");

struct vgpu_cmd_copy {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u32 src_kind; /* offset 8 */
	__u32 dst_kind; /* offset 12 */
	__u64 src; /* offset 16 */
	__u64 dst; /* offset 24 */
	__u64 size; /* offset 32 */
	__u32 sg_count; /* offset 40 */
	__u32 reserved; /* offset 44 */
};

_Static_assert(sizeof(struct vgpu_cmd_copy) == 48, "vgpu_cmd_copy layout");

struct vgpu_sg_entry {
	__u64 addr; /* offset 0 */
	__u64 len; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_sg_entry) == 16, "vgpu_sg_entry layout");

struct vgpu_cmd_array {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u32 format; /* offset 8 */
	__u32 channels; /* offset 12 */
	__u64 width; /* offset 16 */
	__u64 height; /* offset 24 */
	__u64 depth; /* offset 32 */
};

_Static_assert(sizeof(struct vgpu_cmd_array) == 40, "vgpu_cmd_array layout");

struct vgpu_cmd_array_copy {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 src; /* offset 8 */
	__u64 dst; /* offset 16 */
	__u32 src_pitch; /* offset 24 */
	__u32 src_height; /* offset 28 */
	__u32 dst_pitch; /* offset 32 */
	__u32 dst_height; /* offset 36 */
	__u32 src_pos[3]; /* offset 40 */
	__u32 dst_pos[3]; /* offset 52 */
	__u32 extent[3]; /* offset 64 */
	__u32 reserved; /* offset 76 */
};

_Static_assert(sizeof(struct vgpu_cmd_array_copy) == 80, "vgpu_cmd_array_copy layout");

struct vgpu_cmd_object {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 resource; /* offset 8 */
	__u64 size; /* offset 16 */
	__u32 res_type; /* offset 24 */
	__u32 format; /* offset 28 */
	__u32 channels; /* offset 32 */
	__u32 width; /* offset 36 */
	__u32 height; /* offset 40 */
	__u32 address; /* offset 44 */
	__u32 filter; /* offset 48 */
	__u32 tex_flags; /* offset 52 */
	float border[4]; /* offset 56 */
};

_Static_assert(sizeof(struct vgpu_cmd_object) == 72, "vgpu_cmd_object layout");

struct vgpu_cmd_object_destroy {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 handle; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_cmd_object_destroy) == 16, "vgpu_cmd_object_destroy layout");

struct vgpu_cmd_fill {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 addr; /* offset 8 */
	__u64 size; /* offset 16 */
	__u32 pattern; /* offset 24 */
	__u32 reserved; /* offset 28 */
};

_Static_assert(sizeof(struct vgpu_cmd_fill) == 32, "vgpu_cmd_fill layout");

struct vgpu_cmd_module_load {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u32 format; /* offset 8 */
	__u32 reserved; /* offset 12 */
	__u64 image_size; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_cmd_module_load) == 24, "vgpu_cmd_module_load layout");

struct vgpu_cmd_module_unload {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 module; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_cmd_module_unload) == 16, "vgpu_cmd_module_unload layout");

struct vgpu_cmd_launch {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 module; /* offset 8 */
	__u32 grid[3]; /* offset 16 */
	__u32 block[3]; /* offset 28 */
	__u32 shared_mem; /* offset 40 */
	__u32 params_size; /* offset 44 */
	char entry[32]; /* offset 48 */
};

_Static_assert(sizeof(struct vgpu_cmd_launch) == 80, "vgpu_cmd_launch layout");

struct vgpu_cmd_func_info {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 module; /* offset 8 */
	__u64 out; /* offset 16 */
	__u32 out_size; /* offset 24 */
	__u32 name_len; /* offset 28 */
};

_Static_assert(sizeof(struct vgpu_cmd_func_info) == 32, "vgpu_cmd_func_info layout");

struct vgpu_cmd_occupancy {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 module; /* offset 8 */
	__u64 function; /* offset 16 */
	__u32 block[3]; /* offset 24 */
	__u32 shared_mem; /* offset 36 */
	__u32 cluster[3]; /* offset 40 */
	__u32 reserved; /* offset 52 */
};

_Static_assert(sizeof(struct vgpu_cmd_occupancy) == 56, "vgpu_cmd_occupancy layout");

struct vgpu_cmd_console {
	struct vgpu_cmd_hdr hdr; /* offset 0 */
	__u64 module; /* offset 8 */
	__u32 out_size; /* offset 16 */
	__u32 sg_count; /* offset 20 */
};

_Static_assert(sizeof(struct vgpu_cmd_console) == 24, "vgpu_cmd_console layout");

struct vgpu_func_info {
	__u32 param_count; /* offset 0 */
	__u32 params_size; /* offset 4 */
	__u32 max_threads; /* offset 8 */
	__u32 shared_static; /* offset 12 */
	__u32 max_dynamic_shared; /* offset 16 */
	__u32 const_bytes; /* offset 20 */
	__u32 local_bytes; /* offset 24 */
	__u32 num_regs; /* offset 28 */
	__u32 ptx_version; /* offset 32 */
	__u32 binary_version; /* offset 36 */
	__u32 reserved[6]; /* offset 40 */
};

_Static_assert(sizeof(struct vgpu_func_info) == 64, "vgpu_func_info layout");

struct vgpu_func_param {
	__u32 offset; /* offset 0 */
	__u32 size; /* offset 4 */
};

_Static_assert(sizeof(struct vgpu_func_param) == 8, "vgpu_func_param layout");

struct vgpu_global_info {
	__u64 addr; /* offset 0 */
	__u64 size; /* offset 8 */
};

_Static_assert(sizeof(struct vgpu_global_info) == 16, "vgpu_global_info layout");

struct vgpu_completion {
	__u32 status; /* offset 0 */
	__u32 reserved; /* offset 4 */
	__u64 result; /* offset 8 */
	__u64 device_ns; /* offset 16 */
	__u64 result2; /* offset 24 */
};

_Static_assert(sizeof(struct vgpu_completion) == 32, "vgpu_completion layout");

#ifndef __KERNEL__
struct vgpu_fill_params {
	__u64 dst; /* offset 0 */
	__u64 count; /* offset 8 */
	__u32 value; /* offset 16 */
	__u32 reserved; /* offset 20 */
};

_Static_assert(sizeof(struct vgpu_fill_params) == 24, "vgpu_fill_params layout");
#endif

#ifndef __KERNEL__
struct vgpu_copy_params {
	__u64 dst; /* offset 0 */
	__u64 src; /* offset 8 */
	__u64 bytes; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_copy_params) == 24, "vgpu_copy_params layout");
#endif

#ifndef __KERNEL__
struct vgpu_vadd_params {
	__u64 c; /* offset 0 */
	__u64 a; /* offset 8 */
	__u64 b; /* offset 16 */
	__u64 n; /* offset 24 */
};

_Static_assert(sizeof(struct vgpu_vadd_params) == 32, "vgpu_vadd_params layout");
#endif

#ifndef __KERNEL__
struct vgpu_saxpy_params {
	__u64 y; /* offset 0 */
	__u64 x; /* offset 8 */
	__u64 n; /* offset 16 */
	float a; /* offset 24 */
	__u32 reserved; /* offset 28 */
};

_Static_assert(sizeof(struct vgpu_saxpy_params) == 32, "vgpu_saxpy_params layout");
#endif

#ifndef __KERNEL__
struct vgpu_sgemm_params {
	__u64 c; /* offset 0 */
	__u64 a; /* offset 8 */
	__u64 b; /* offset 16 */
	__u32 m; /* offset 24 */
	__u32 n; /* offset 28 */
	__u32 k; /* offset 32 */
	__u32 reserved; /* offset 36 */
	float alpha; /* offset 40 */
	float beta; /* offset 44 */
};

_Static_assert(sizeof(struct vgpu_sgemm_params) == 48, "vgpu_sgemm_params layout");
#endif

#ifndef __KERNEL__
struct vgpu_reduce_sum_params {
	__u64 out; /* offset 0 */
	__u64 input; /* offset 8 */
	__u64 n; /* offset 16 */
};

_Static_assert(sizeof(struct vgpu_reduce_sum_params) == 24, "vgpu_reduce_sum_params layout");
#endif

#endif /* VGPU_ABI_H */
