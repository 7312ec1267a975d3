/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vgpu: driver for the virtual GPU functions of vgpud.
 *
 * Objects and their lifetimes:
 *
 *   vgpu_dev    one PCI function. Refcounted: the PCI binding holds one
 *               reference, every open file and every batch another, so
 *               files survive remove() and only see -ENODEV.
 *   vgpu_queue  one virtio split ring in coherent DMA memory, embedded in
 *               vgpu_dev. Its spinlock protects the ring, the descriptor
 *               free list and the in-flight slots; it is taken in hard
 *               interrupt context.
 *   vgpu_file   one open file. Owns device allocations and modules
 *               (tracked so a file can only name its own memory, and so
 *               close frees them) and the records of its batches. With
 *               the device's contexts, a file that is not a lane has a
 *               context id of its own (vgpu_dev.ctx_ida), which every
 *               command of the file and its lanes carries; the id is
 *               given back when the structure is freed, after the
 *               CTX_DESTROY that ended the context completed.
 *   vgpu_batch  one SUBMIT (or one driver-internal command group): the
 *               commands, their staging buffers, pinned user pages and
 *               results. Refcounted: the ring holds a reference while it
 *               is in flight, the file's fence table another until the
 *               fence is collected.
 *
 * Lock order: vgpu_dev.hw_lock (read) -> vgpu_file.submit_lock ->
 * vgpu_queue.lock -> vgpu_file.res_lock. Faults on the window mapping
 * take vgpu_dev.map_lock instead of hw_lock, so an ioctl may touch user
 * memory while it holds hw_lock.
 */
#ifndef VGPU_DRV_H
#define VGPU_DRV_H

#include <linux/cdev.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/kref.h>
#include <linux/list.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/rbtree.h>
#include <linux/rwsem.h>
#include <linux/scatterlist.h>
#include <linux/spinlock.h>
#include <linux/types.h>
#include <linux/wait.h>
#include <linux/workqueue.h>
#include <linux/xarray.h>

#include "include/vgpu_abi.h"
#include "include/uapi/vgpu.h"

#define VGPU_NAME		"vgpu"
#define VGPU_MAX_MINORS		256

/*
 * Per ring head: a command slot of 256 bytes holds the device command
 * structure (at most 128 bytes) and small data inline (a short
 * scatter-gather list or a small parameter block), so common commands
 * need no DMA allocation of their own.
 */
#define VGPU_SLOT_SIZE		256
#define VGPU_SLOT_CMD_BYTES	128
#define VGPU_SLOT_DATA_OFF	128
#define VGPU_SLOT_DATA_BYTES	(VGPU_SLOT_SIZE - VGPU_SLOT_DATA_OFF)
#define VGPU_INLINE_SG		(VGPU_SLOT_DATA_BYTES / sizeof(struct vgpu_sg_entry))

/* How long close waits for the device to free a file's memory. */
#define VGPU_CLOSE_WAIT		(2 * HZ)

/* The device takes at most this many descriptors of one chain. */
#define VGPU_MAX_CHAIN		64
/* Data descriptors of one chain: all but the command and completion. */
#define VGPU_MAX_DATA_DESCS	(VGPU_MAX_CHAIN - 2)

/* Virtio split ring, little-endian. */
struct vgpu_vring_desc {
	__le64 addr;
	__le32 len;
	__le16 flags;
	__le16 next;
};

#define VGPU_VRING_F_NEXT	1
#define VGPU_VRING_F_WRITE	2

struct vgpu_vring_avail {
	__le16 flags;
	__le16 idx;
	__le16 ring[];		/* then used_event */
};

struct vgpu_vring_used_elem {
	__le32 id;
	__le32 len;
};

struct vgpu_vring_used {
	__le16 flags;
	__le16 idx;
	struct vgpu_vring_used_elem ring[];	/* then avail_event */
};

/* The device command structures, as written into a command slot. */
union vgpu_dcmd {
	struct vgpu_cmd_hdr hdr;
	struct vgpu_cmd_fence fence;
	struct vgpu_cmd_mem_alloc mem_alloc;
	struct vgpu_cmd_mem_free mem_free;
	struct vgpu_cmd_copy copy;
	struct vgpu_cmd_fill fill;
	struct vgpu_cmd_module_load module_load;
	struct vgpu_cmd_module_unload module_unload;
	struct vgpu_cmd_launch launch;
	struct vgpu_cmd_func_info func_info;
	struct vgpu_cmd_occupancy occupancy;
	struct vgpu_cmd_console console;
	struct vgpu_cmd_value value;
	struct vgpu_cmd_va va;
	struct vgpu_cmd_mem_create mem_create;
	struct vgpu_cmd_mem_map mem_map;
	struct vgpu_cmd_mem_access mem_access;
	struct vgpu_cmd_array array;
	struct vgpu_cmd_array_copy array_copy;
	struct vgpu_cmd_object object;
	struct vgpu_cmd_object_destroy object_destroy;
};

struct vgpu_batch;
struct vgpu_dev;
struct vgpu_file;

/* An in-flight command, indexed by the head descriptor of its chain. */
struct vgpu_slot {
	struct vgpu_batch *batch;	/* NULL when free */
	u32 cmd;			/* index in batch->cmds */
	u16 last;			/* last descriptor of the chain */
	u16 ndesc;
};

struct vgpu_queue {
	struct vgpu_dev *vdev;
	unsigned int index;
	unsigned int size;		/* ring entries, a power of two */
	unsigned int vector;		/* MSI-X entry (or the INTx value) */
	bool polled;

	/* The ring, the shadow state below, done_list, files' inflight. */
	spinlock_t lock;

	/* Ring: descriptor table, available ring, used ring. */
	void *ring;
	dma_addr_t ring_dma;
	size_t ring_bytes;
	struct vgpu_vring_desc *desc;
	struct vgpu_vring_avail *avail;
	struct vgpu_vring_used *used;
	__le16 *used_event;		/* written by the driver */
	__le16 *avail_event;		/* written by the device */
	dma_addr_t avail_dma;
	dma_addr_t used_dma;

	/* Command slots, completions and the fence word. */
	void *cbuf;
	dma_addr_t cbuf_dma;
	size_t cbuf_bytes;
	struct vgpu_completion *compl;
	dma_addr_t compl_dma;
	dma_addr_t fence_dma;

	/* Driver-private shadow state, under lock. */
	struct vgpu_slot *slots;
	u16 *next;			/* descriptor links (free list, chains) */
	u16 *heads;			/* head of each available ring entry */
	u16 free_head;
	unsigned int num_free;
	u16 avail_idx;
	u16 last_used;
	u16 kick_idx;			/* avail_idx at the last notification check */
	bool broken;			/* being recovered: no new submissions */
	bool failed;			/* could not be re-enabled */
	bool stopped;			/* the function is going away */
	bool dead;			/* ring memory is gone */
	bool corrupt;			/* the used ring made no sense */

	wait_queue_head_t space_wq;	/* descriptors freed, state changes */
	struct list_head done_list;	/* completed batches to clean up */
	struct work_struct done_work;
};

struct vgpu_vec {
	struct vgpu_dev *vdev;
	unsigned int index;
	bool requested;
	char name[32];
};

struct vgpu_dev {
	struct kref ref;
	struct pci_dev *pdev;
	void __iomem *regs;
	void __iomem *db;

	/* Identity and partition, read at probe. */
	u32 version;
	u64 features;
	u64 mem_size;			/* follows a resize (ABI 1.8) */
	bool config_changed;		/* IRQ_CAUSE_CONFIG seen, not handled */
	u32 compute_units;
	u32 max_queues;
	u32 max_queue_size;
	u64 win_dev_size;		/* WINDOW_SIZE, for window commands */
	u64 win_size;			/* mappable bytes, 0 without mmap */
	resource_size_t win_phys;

	unsigned int nq;
	struct vgpu_queue *queues;
	unsigned int qsize;
	bool polled;

	int nvec;
	bool msix;
	struct vgpu_vec *vecs;

	int minor;
	struct cdev *cdev;
	struct device *chardev;

	/*
	 * Held for reading by every path that touches BAR0 or user mappings
	 * of the window, for writing by remove(), which sets dead first.
	 */
	struct rw_semaphore hw_lock;
	struct rw_semaphore map_lock;	/* window faults against the zap */
	bool dead;
	u16 pci_cmd;			/* PCI command register to restore */
	u64 gen;			/* bumped by each function reset */

	struct mutex files_lock;	/* files, nfiles, next_queue */
	struct list_head files;
	unsigned int nfiles;
	unsigned int next_queue;

	struct work_struct err_work;
	struct delayed_work watchdog;
	u32 err_seen;			/* ERROR_COUNT already logged */
	atomic_t recoveries;

	/* FEATURE_CONTEXTS: the files' context ids; else none are used. */
	bool contexts;
	u32 max_contexts;		/* MAX_CONTEXTS, read at probe */
	u64 context_cost;		/* CONTEXT_COST, read at probe */
	struct ida ctx_ida;
};

/*
 * A device allocation, a loaded module or a piece of virtual memory,
 * owned by one file.
 */
struct vgpu_res {
	struct rb_node node;		/* allocs, vas or phys of vgpu_file */
	struct list_head link;		/* module: vgpu_file.modules */
	u64 addr;			/* device address, module or physical handle */
	u64 size;			/* phys: 1 in the tree, bytes in bytes */
	u64 owner;			/* global: its module's handle */
	u64 bytes;			/* phys: its size */
	bool module;
	bool global;			/* a module's global, in allocs */
	bool dying;			/* unload checked, not yet on the ring */
	bool va;			/* a reservation, in vas */
	bool phys;			/* a physical allocation, in phys */
	bool mapping;			/* a mapping, in allocs */
};

/* User memory pinned and mapped for the device once (VGPU_IOCTL_PIN). */
struct vgpu_pinned {
	struct kref ref;		/* the file's list, copies using it */
	struct vgpu_dev *vdev;		/* referenced */
	struct list_head link;		/* vgpu_file.pinned */
	u64 uaddr;
	u64 size;
	struct page **pages;
	long npages;
	struct sg_table sgt;		/* mapped DMA_BIDIRECTIONAL */
	bool need_sync;			/* not DMA-coherent: sync around copies */
};

struct vgpu_file {
	struct kref ref;
	struct vgpu_dev *vdev;
	struct vgpu_queue *q;		/* every command of the file goes here */
	struct vgpu_file *owner;	/* a lane's: whose resources it uses (ref) */
	u32 nlanes;			/* lanes made of this file (files_lock) */
	struct file *filp;
	struct pid *tgid;
	struct list_head link;		/* vgpu_dev.files */

	/* Validation and insertion of a file's commands are one step. */
	struct mutex submit_lock;

	/*
	 * The file's resources: allocs to res_gen. allocs holds allocations,
	 * globals and mappings by address; vas the reservations, phys the
	 * physical allocations by handle (virtual memory management).
	 */
	spinlock_t res_lock;
	struct rb_root allocs;
	struct rb_root vas;
	struct rb_root phys;
	struct list_head modules;
	u64 mem_bytes;
	u32 nallocs;
	u32 nmodules;
	u64 res_gen;			/* vgpu_dev.gen the resources belong to */
	bool state_lost;		/* a function reset ended what it held */

	/* Pinned ranges, sorted by nothing: few, looked up per COPY. */
	struct mutex pin_lock;
	struct list_head pinned;
	u32 npinned;
	long pinned_pages;

	struct xarray batches;		/* fence -> uncollected batch */
	atomic_t nrecords;
	u64 next_seq;			/* under submit_lock */
	u64 done_seq;			/* under the queue lock, read with acquire */
	wait_queue_head_t wq;

	/* Under the queue lock. */
	unsigned int inflight;
	bool closing;
	bool queued;			/* something was ever put on the ring */

	/*
	 * The device context of the file (0: the function's own). A lane's
	 * commands carry its owner's; the owner counts itself and its lanes
	 * not yet cleaned up in ctx_users and ends the context with the
	 * last of them. ctx_used: a command that makes the context (one
	 * that needs device state) carried the id.
	 */
	u16 ctx;
	bool ctx_used;
	atomic_t ctx_users;

	struct work_struct cleanup_work;
};

struct vgpu_dmabuf {
	void *cpu;
	dma_addr_t dma;
	size_t size;			/* allocated */
	u32 len;			/* used */
};

/* One command of a batch: the device command, its staging and results. */
struct vgpu_bcmd {
	union vgpu_dcmd dcmd;
	u32 dlen;
	u32 npieces;			/* device commands it becomes */
	u32 ndesc;			/* descriptors of all pieces */

	/* Data descriptors: inline in the slot, or coherent buffers. */
	u64 inl[VGPU_SLOT_DATA_BYTES / sizeof(u64)];
	u32 inl_len;
	struct vgpu_dmabuf *bufs;
	u32 nbufs;

	/* A COPY with a user side: pinned pages mapped for DMA. */
	struct page **pages;
	u32 npages;
	bool dirty;
	bool mapped;
	enum dma_data_direction dir;
	struct sg_table sgt;
	u32 nents;
	u64 *piece_len;			/* when npieces > 1 */
	u64 size;
	struct vgpu_pinned *pinned;	/* the COPY's range was pinned (ref) */

	/* MEM_ALLOC / MODULE_LOAD: the record to keep on success. */
	struct vgpu_res *res;

	/* Results. */
	u32 status;
	s32 error;
	u64 result;
	u64 result2;
	u64 device_ns;
};

struct vgpu_batch {
	struct kref ref;
	struct vgpu_dev *vdev;
	struct vgpu_file *vf;		/* NULL for close-time cleanup */
	u64 seq;			/* fence, 0 for driver-internal batches */
	u64 gen;
	u16 ctx;			/* the context its commands carry */
	struct vgpu_file *ctx_hold;	/* CTX_DESTROY: the id's file (ref) */
	u32 ndesc;
	u32 pending;			/* pieces on the ring, queue lock */
	bool done;			/* release/acquire */
	struct list_head done_link;
	u32 ncmds;
	struct vgpu_bcmd cmds[] __counted_by(ncmds);
};

/* Module parameters. */
extern unsigned int vgpu_poll_spin_us;

extern struct workqueue_struct *vgpu_wq;

/* vgpu_main.c */
void vgpu_dev_put(struct vgpu_dev *vdev);
void vgpu_file_put(struct vgpu_file *vf);
long vgpu_ioctl_lane(struct vgpu_file *vf, void __user *arg);

/* The file whose device memory, modules and pinned ranges @vf uses. */
static inline struct vgpu_file *vgpu_res_file(struct vgpu_file *vf)
{
	return vf->owner ? vf->owner : vf;
}

void vgpu_schedule_recovery(struct vgpu_dev *vdev);
int vgpu_status_errno(u32 status);

/* vgpu_queue.c */
int vgpu_queue_init(struct vgpu_dev *vdev, struct vgpu_queue *q,
		    unsigned int index, unsigned int size);
void vgpu_queue_free_mem(struct vgpu_queue *q);
int vgpu_queue_hw_enable(struct vgpu_queue *q);
void vgpu_queue_hw_disable(struct vgpu_queue *q);
int vgpu_queue_submit(struct vgpu_queue *q, struct vgpu_batch *b,
		      bool interruptible);
void vgpu_queue_reap(struct vgpu_queue *q);
bool vgpu_queue_busy(struct vgpu_queue *q);
bool vgpu_queue_needs_reset(struct vgpu_queue *q);
void vgpu_queue_recover(struct vgpu_queue *q);
void vgpu_queue_set_broken(struct vgpu_queue *q);
void vgpu_queue_fail_and_reset(struct vgpu_queue *q, int err);
void vgpu_queue_stop(struct vgpu_queue *q);
u32 vgpu_queue_hw_status(struct vgpu_queue *q, u32 *error);
void vgpu_queue_resume(struct vgpu_queue *q, bool failed);
struct vgpu_batch *vgpu_batch_alloc(struct vgpu_dev *vdev,
				    struct vgpu_file *vf, u32 ncmds);
void vgpu_batch_release_resources(struct vgpu_batch *b);
void vgpu_batch_put(struct vgpu_batch *b);

/* vgpu_ioctl.c */
long vgpu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg);
void vgpu_pinned_put(struct vgpu_pinned *p);
void vgpu_unpin_all(struct vgpu_file *vf);
int vgpu_res_sync_gen(struct vgpu_file *vf, u64 gen);
void vgpu_res_record(struct vgpu_file *vf, struct vgpu_res *res, u64 gen,
		     u64 value);
void vgpu_file_cleanup(struct vgpu_file *vf, bool wait);
void vgpu_file_cleanup_work(struct work_struct *work);
void vgpu_res_drop_all(struct vgpu_file *vf);

#endif /* VGPU_DRV_H */
