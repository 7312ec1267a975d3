// SPDX-License-Identifier: GPL-2.0
/*
 * vgpu ioctls: device memory ownership, command validation and staging
 * (pinning user memory, copying images and parameters into DMA memory),
 * fences and results.
 *
 * Nothing a process passes is trusted: every size is capped, every user
 * pointer goes through the uaccess helpers or pin_user_pages_fast(), and
 * every device address a command names must lie inside an allocation of
 * the calling file, so a process cannot reach another process's memory
 * even on the same function.
 */

#include <linux/dma-mapping.h>
#include <linux/fs.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/ktime.h>
#include <linux/mm.h>
#include <linux/overflow.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/uaccess.h>

#include "vgpu_drv.h"

/* The results part of struct vgpu_cmd. */
struct vgpu_cmd_out {
	__u32 status;
	__s32 error;
	__u64 result;
	__u64 device_ns;
	__u64 result2;
};

static_assert(sizeof(struct vgpu_cmd) == 128);
static_assert(offsetof(struct vgpu_cmd, status) + sizeof(struct vgpu_cmd_out) ==
	      sizeof(struct vgpu_cmd));
static_assert(sizeof(struct vgpu_launch_args) == 80);
static_assert(sizeof(struct vgpu_submit) == 40);
static_assert(sizeof(struct vgpu_wait) == 48);
static_assert(sizeof(struct vgpu_info) == 104);
static_assert(sizeof(struct vgpu_usage) == 96);
static_assert(VGPU_MAX_IMAGE_BYTES == VGPU_MAX_MODULE_SIZE);
static_assert(VGPU_MAX_PARAMS_BYTES == VGPU_MAX_PARAMS_SIZE);
static_assert(sizeof_field(struct vgpu_cmd_launch, entry) == VGPU_ENTRY_NAME_LEN);
static_assert(VGPU_CMD_STATUS_OK == VGPU_STATUS_OK);
static_assert(VGPU_CMD_STATUS_INVALID == VGPU_STATUS_INVALID);
static_assert(VGPU_CMD_STATUS_FAULT == VGPU_STATUS_FAULT);
static_assert(VGPU_CMD_STATUS_NO_MEMORY == VGPU_STATUS_NO_MEMORY);
static_assert(VGPU_CMD_STATUS_UNSUPPORTED == VGPU_STATUS_UNSUPPORTED);
static_assert(VGPU_CMD_STATUS_NOT_FOUND == VGPU_STATUS_NOT_FOUND);
static_assert(VGPU_CMD_STATUS_CANCELLED == VGPU_STATUS_CANCELLED);
static_assert(VGPU_CMD_STATUS_OUT_OF_RANGE == VGPU_STATUS_OUT_OF_RANGE);
static_assert(VGPU_CMD_STATUS_DEVICE_ERROR == VGPU_STATUS_DEVICE_ERROR);
static_assert(VGPU_CMD_STATUS_KERNEL_FAULT == VGPU_STATUS_KERNEL_FAULT);
static_assert(VGPU_CMD_STATUS_KERNEL_ASSERT == VGPU_STATUS_KERNEL_ASSERT);
static_assert(VGPU_CMD_STATUS_CONTEXT_LOST == VGPU_STATUS_CONTEXT_LOST);
static_assert(VGPU_MODULE_BUILTIN_ID == VGPU_MODULE_BUILTIN);
static_assert(VGPU_MODULE_PTX == VGPU_MODULE_FORMAT_PTX);
static_assert(VGPU_MODULE_FATBIN == VGPU_MODULE_FORMAT_FATBIN);
static_assert(VGPU_MODULE_CUBIN == VGPU_MODULE_FORMAT_CUBIN);
static_assert(VGPU_CMD_NOP == VGPU_OP_NOP);
static_assert(VGPU_CMD_FENCE == VGPU_OP_FENCE);
static_assert(VGPU_CMD_WRITE_VALUE == VGPU_OP_WRITE_VALUE);
static_assert(VGPU_CMD_WAIT_VALUE == VGPU_OP_WAIT_VALUE);
static_assert(VGPU_CMD_VALUE_32 == VGPU_VALUE_FLAG_32);
static_assert(VGPU_CMD_WAIT_EQ == VGPU_WAIT_EQ);
static_assert(VGPU_CMD_WAIT_AND == VGPU_WAIT_AND);
static_assert(VGPU_CMD_WAIT_NOR == VGPU_WAIT_NOR);
static_assert(VGPU_CMD_COPY == VGPU_OP_COPY);
static_assert(VGPU_CMD_FILL == VGPU_OP_FILL);
static_assert(VGPU_CMD_MODULE_LOAD == VGPU_OP_MODULE_LOAD);
static_assert(VGPU_CMD_MODULE_UNLOAD == VGPU_OP_MODULE_UNLOAD);
static_assert(VGPU_CMD_LAUNCH == VGPU_OP_LAUNCH);
static_assert(VGPU_CMD_TIMESTAMP == VGPU_OP_TIMESTAMP);
static_assert(VGPU_CMD_FUNC_INFO == VGPU_OP_FUNC_INFO);
static_assert(VGPU_CMD_OCCUPANCY == VGPU_OP_OCCUPANCY);
static_assert(VGPU_CMD_CONSOLE == VGPU_OP_CONSOLE);
static_assert(VGPU_MODULE_PRINTS == VGPU_MODULE_FLAG_PRINTS);
static_assert(VGPU_MAX_CONSOLE_BYTES == VGPU_CONSOLE_BYTES);
static_assert(VGPU_CMD_LAUNCH_FUNCTION == VGPU_LAUNCH_FLAG_FUNCTION);
static_assert(VGPU_CMD_LAUNCH_COOPERATIVE == VGPU_LAUNCH_FLAG_COOPERATIVE);
static_assert(VGPU_MAX_FUNC_NAME_BYTES == VGPU_MAX_ENTRY_NAME);
static_assert(VGPU_CMD_FUNC_INFO_GLOBAL == VGPU_FUNC_INFO_FLAG_GLOBAL);
static_assert(VGPU_CMD_ARRAY_CREATE == VGPU_OP_ARRAY_CREATE);
static_assert(VGPU_CMD_ARRAY_COPY == VGPU_OP_ARRAY_COPY);
static_assert(VGPU_CMD_OBJECT_CREATE == VGPU_OP_OBJECT_CREATE);
static_assert(VGPU_CMD_OBJECT_DESTROY == VGPU_OP_OBJECT_DESTROY);
static_assert(VGPU_CMD_ARRAY_LAYERED == VGPU_ARRAY_FLAG_LAYERED);
static_assert(VGPU_CMD_ARRAY_SURFACE == VGPU_ARRAY_FLAG_SURFACE);
static_assert(VGPU_CMD_ARRAY_CUBEMAP == VGPU_ARRAY_FLAG_CUBEMAP);
static_assert(VGPU_CMD_COPY_SRC_ARRAY == VGPU_ARRAY_COPY_SRC_ARRAY);
static_assert(VGPU_CMD_COPY_DST_ARRAY == VGPU_ARRAY_COPY_DST_ARRAY);
static_assert(VGPU_OBJ_ARRAY == VGPU_OBJECT_ARRAY);
static_assert(VGPU_OBJ_TEXTURE == VGPU_OBJECT_TEXTURE);
static_assert(VGPU_OBJ_SURFACE == VGPU_OBJECT_SURFACE);
/* Their arguments are the device's commands after the header. */
static_assert(sizeof(struct vgpu_cmd_array) ==
	      sizeof(struct vgpu_cmd_hdr) + sizeof(struct vgpu_array_args));
static_assert(sizeof(struct vgpu_cmd_array_copy) ==
	      sizeof(struct vgpu_cmd_hdr) + sizeof(struct vgpu_array_copy_args));
static_assert(sizeof(struct vgpu_cmd_object) ==
	      sizeof(struct vgpu_cmd_hdr) + sizeof(struct vgpu_object_args));
static_assert(sizeof(struct vgpu_cmd_object_destroy) ==
	      sizeof(struct vgpu_cmd_hdr) + sizeof(struct vgpu_object_destroy_args));

/*
 * Parameter blocks of the built-in module, whose device pointers the
 * driver checks. Same layouts as the vgpu_*_params structures of the
 * device ABI (which that header shows only to user space).
 */
struct vgpu_k_fill { u64 dst, count; u32 value, reserved; };
struct vgpu_k_copy { u64 dst, src, bytes; };
struct vgpu_k_vadd { u64 c, a, b, n; };
struct vgpu_k_saxpy { u64 y, x, n; u32 a, reserved; };
struct vgpu_k_sgemm { u64 c, a, b; u32 m, n, k, reserved, alpha, beta; };
struct vgpu_k_reduce { u64 out, input, n; };

static_assert(sizeof(struct vgpu_k_fill) == 24);
static_assert(sizeof(struct vgpu_k_copy) == 24);
static_assert(sizeof(struct vgpu_k_vadd) == 32);
static_assert(sizeof(struct vgpu_k_saxpy) == 32);
static_assert(sizeof(struct vgpu_k_sgemm) == 48);
static_assert(sizeof(struct vgpu_k_reduce) == 24);

/* ---- device resources of a file ------------------------------------------ */

static void vgpu_res_drop_all_locked(struct vgpu_file *vf)
{
	struct vgpu_res *r, *tmp;

	rbtree_postorder_for_each_entry_safe(r, tmp, &vf->allocs, node)
		kfree(r);
	vf->allocs = RB_ROOT;
	rbtree_postorder_for_each_entry_safe(r, tmp, &vf->vas, node)
		kfree(r);
	vf->vas = RB_ROOT;
	rbtree_postorder_for_each_entry_safe(r, tmp, &vf->phys, node)
		kfree(r);
	vf->phys = RB_ROOT;
	list_for_each_entry_safe(r, tmp, &vf->modules, link) {
		list_del(&r->link);
		kfree(r);
	}
	vf->mem_bytes = 0;
	vf->nallocs = 0;
	vf->nmodules = 0;
}

/*
 * Resources of an older generation died with a function reset. A file
 * that held any has lost its device state for good (see
 * vgpu_file_check_lost()).
 */
static void vgpu_res_sync_gen_locked(struct vgpu_file *vf, u64 gen)
{
	if (vf->res_gen < gen) {
		if (vf->nallocs || vf->nmodules || vf->mem_bytes ||
		    !RB_EMPTY_ROOT(&vf->vas) || !RB_EMPTY_ROOT(&vf->phys))
			vf->state_lost = true;
		vgpu_res_drop_all_locked(vf);
		vf->res_gen = gen;
	}
}

/*
 * A process whose device state a function reset ended (a fault of the
 * partition every process of the function shares) is told so, with
 * ENOTRECOVERABLE (CUDA_ERROR_CONTEXT_IS_DESTROYED), from then on: its
 * handles would name nothing, or something else, in the fresh partition.
 */
static int vgpu_file_check_lost(struct vgpu_file *vf)
{
	struct vgpu_file *rf = vgpu_res_file(vf);
	unsigned long flags;
	int ret = 0;

	spin_lock_irqsave(&rf->res_lock, flags);
	vgpu_res_sync_gen_locked(rf, READ_ONCE(rf->vdev->gen));
	if (rf->state_lost)
		ret = -ENOTRECOVERABLE;
	spin_unlock_irqrestore(&rf->res_lock, flags);
	return ret;
}

/*
 * Brings the file's resources (its owner's, for a lane) to generation
 * @gen; -ENOTRECOVERABLE when a reset ended what it held, so that a
 * command naming it never reaches the fresh partition.
 */
int vgpu_res_sync_gen(struct vgpu_file *vf, u64 gen)
{
	struct vgpu_file *rf = vgpu_res_file(vf);
	unsigned long flags;
	int ret;

	spin_lock_irqsave(&rf->res_lock, flags);
	vgpu_res_sync_gen_locked(rf, gen);
	ret = rf->state_lost ? -ENOTRECOVERABLE : 0;
	spin_unlock_irqrestore(&rf->res_lock, flags);
	return ret;
}

/* Files @res in @root, a tree of ranges that do not overlap. */
static bool vgpu_range_insert(struct rb_root *root, struct vgpu_res *res)
{
	struct rb_node **link = &root->rb_node, *parent = NULL;
	u64 end;

	if (!res->size || check_add_overflow(res->addr, res->size, &end))
		return false;
	while (*link) {
		struct vgpu_res *r = rb_entry(*link, struct vgpu_res, node);

		parent = *link;
		if (end <= r->addr)
			link = &parent->rb_left;
		else if (res->addr >= r->addr + r->size)
			link = &parent->rb_right;
		else
			return false;	/* overlaps */
	}
	rb_link_node(&res->node, parent, link);
	rb_insert_color(&res->node, root);
	return true;
}

static bool vgpu_alloc_insert(struct vgpu_file *vf, struct vgpu_res *res)
{
	return vgpu_range_insert(&vf->allocs, res);
}

/* The range of @root containing addr. res_lock held. */
static struct vgpu_res *vgpu_range_find(struct rb_root *root, u64 addr)
{
	struct rb_node *n = root->rb_node;

	while (n) {
		struct vgpu_res *r = rb_entry(n, struct vgpu_res, node);

		if (addr < r->addr)
			n = n->rb_left;
		else if (addr - r->addr >= r->size)
			n = n->rb_right;
		else
			return r;
	}
	return NULL;
}

/* The allocation, global or mapping containing addr. res_lock held. */
static struct vgpu_res *vgpu_alloc_find(struct vgpu_file *vf, u64 addr)
{
	return vgpu_range_find(&vf->allocs, addr);
}

/* A module of the file, not being unloaded. res_lock held. */
static struct vgpu_res *vgpu_module_find(struct vgpu_file *vf, u64 handle)
{
	struct vgpu_res *r;

	list_for_each_entry(r, &vf->modules, link)
		if (r->addr == handle && !r->dying)
			return r;
	return NULL;
}

/* 0 when module @handle is the file's (and not being unloaded). */
static int vgpu_module_owned(struct vgpu_file *vf, u64 handle)
{
	unsigned long flags;
	struct vgpu_res *m;

	spin_lock_irqsave(&vf->res_lock, flags);
	m = vgpu_module_find(vf, handle);
	spin_unlock_irqrestore(&vf->res_lock, flags);
	return m ? 0 : -ENOENT;
}

/*
 * Keeps the result of a MEM_ALLOC or MODULE_LOAD. Called at completion,
 * with the queue lock held (interrupts off).
 */
void vgpu_res_record(struct vgpu_file *vf, struct vgpu_res *res, u64 gen,
		     u64 value)
{
	spin_lock(&vf->res_lock);
	if (gen < vf->res_gen) {
		kfree(res);
		goto out;
	}
	vgpu_res_sync_gen_locked(vf, gen);
	/* A mapping has no result: its address was the command's. */
	if (!res->mapping)
		res->addr = value;
	if (res->va || res->phys) {
		if (vgpu_range_insert(res->va ? &vf->vas : &vf->phys, res)) {
			vf->mem_bytes += res->bytes;
		} else {
			dev_warn_ratelimited(&vf->vdev->pdev->dev,
					     "device returned an unusable %s %#llx\n",
					     res->va ? "reservation" : "handle",
					     value);
			kfree(res);
		}
	} else if (res->mapping) {
		/* Checked against the file's own mappings before it ran. */
		if (!vgpu_alloc_insert(vf, res))
			kfree(res);
	} else if (res->module) {
		list_add_tail(&res->link, &vf->modules);
		vf->nmodules++;
	} else if (res->global) {
		struct vgpu_res *r = vgpu_alloc_find(vf, value);

		/* A global looked up again is already the file's. */
		if (r && r->global && r->addr == value && r->size == res->size &&
		    r->owner == res->owner)
			kfree(res);
		else if (!vgpu_alloc_insert(vf, res)) {
			dev_warn_ratelimited(&vf->vdev->pdev->dev,
					     "device returned an unusable global %#llx+%#llx\n",
					     value, res->size);
			kfree(res);
		}
	} else if (vgpu_alloc_insert(vf, res)) {
		vf->mem_bytes += res->size;
		vf->nallocs++;
	} else {
		dev_warn_ratelimited(&vf->vdev->pdev->dev,
				     "device returned an unusable allocation %#llx+%#llx\n",
				     value, res->size);
		kfree(res);
	}
out:
	spin_unlock(&vf->res_lock);
}

/*
 * 0 when [addr, addr + len) lies inside one allocation of the file, or
 * inside mappings of the file side by side (the device copies across
 * those as across one allocation).
 */
static int vgpu_check_dev_range(struct vgpu_file *vf, u64 addr, u64 len)
{
	struct vgpu_res *r;
	unsigned long flags;
	int ret = 0;

	if (!len)
		return 0;
	spin_lock_irqsave(&vf->res_lock, flags);
	r = vgpu_alloc_find(vf, addr);
	if (!r)
		ret = -ENOENT;
	while (r && len > r->size - (addr - r->addr)) {
		u64 next = r->addr + r->size;

		if (!r->mapping) {
			ret = -ERANGE;
			break;
		}
		len -= next - addr;
		addr = next;
		r = vgpu_alloc_find(vf, next);
		if (!r || !r->mapping || r->addr != next) {
			ret = -ERANGE;
			break;
		}
	}
	spin_unlock_irqrestore(&vf->res_lock, flags);
	return ret;
}

/*
 * 0 when [addr, addr + len) is made of whole mappings of the file, every
 * byte mapped: what the device's UNMAP and MEM_ACCESS take. res_lock held.
 */
static int vgpu_whole_mappings_locked(struct vgpu_file *vf, u64 addr, u64 len)
{
	struct vgpu_res *r;
	u64 end;

	if (!len || check_add_overflow(addr, len, &end))
		return -EINVAL;
	while (addr < end) {
		r = vgpu_alloc_find(vf, addr);
		if (!r || !r->mapping || r->addr != addr ||
		    r->size > end - addr)
			return -EINVAL;
		addr += r->size;
	}
	return 0;
}

/*
 * MODULE_UNLOAD marks its module dying while the batch is checked,
 * so later commands of the same batch cannot name it; the mark becomes a
 * removal once the batch is on the ring, or is undone.
 */
/* Forgets the globals of module @handle. res_lock held. */
static void vgpu_globals_drop_locked(struct vgpu_file *vf, u64 handle)
{
	struct rb_node *n = rb_first(&vf->allocs);

	while (n) {
		struct vgpu_res *r = rb_entry(n, struct vgpu_res, node);

		n = rb_next(n);
		if (r->global && r->owner == handle) {
			rb_erase(&r->node, &vf->allocs);
			kfree(r);
		}
	}
}

static void vgpu_modules_settle(struct vgpu_file *vf, bool commit)
{
	struct vgpu_res *r, *tmp;
	unsigned long flags;

	spin_lock_irqsave(&vf->res_lock, flags);
	list_for_each_entry_safe(r, tmp, &vf->modules, link) {
		if (!r->dying)
			continue;
		if (commit) {
			vgpu_globals_drop_locked(vf, r->addr);
			list_del(&r->link);
			vf->nmodules--;
			kfree(r);
		} else {
			r->dying = false;
		}
	}
	spin_unlock_irqrestore(&vf->res_lock, flags);
}

/* ---- command preparation ---------------------------------------------------- */

struct vgpu_budget {
	struct vgpu_file *vf;
	u64 pinned;
	u64 staged;
};

static bool vgpu_args_tail_zero(const struct vgpu_cmd *u, size_t used)
{
	const u8 *p = (const u8 *)u->raw;

	return !memchr_inv(p + used, 0, sizeof(u->raw) - used);
}

/*
 * Coherent buffers for total bytes, in at most max_bufs pieces: big
 * pieces first, smaller ones if memory is fragmented.
 */
static int vgpu_stage_alloc(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			    u64 total, u32 max_bufs)
{
	struct device *dev = &vdev->pdev->dev;
	u64 min_chunk = PAGE_ALIGN(DIV_ROUND_UP_ULL(total, max_bufs));
	u64 chunk = max_t(u64, min_t(u64, total, SZ_1M), min_chunk);

	for (;;) {
		u32 n = DIV_ROUND_UP_ULL(total, chunk), i;
		u64 off = 0;

		c->bufs = kcalloc(n, sizeof(*c->bufs), GFP_KERNEL);
		if (!c->bufs)
			return -ENOMEM;
		for (i = 0; i < n; i++) {
			size_t len = min_t(u64, total - off, chunk);
			struct vgpu_dmabuf *b = &c->bufs[i];

			b->cpu = dma_alloc_coherent(dev, len, &b->dma,
						    GFP_KERNEL | __GFP_NOWARN);
			if (!b->cpu)
				break;
			b->size = len;
			b->len = len;
			c->nbufs++;
			off += len;
		}
		if (i == n)
			return 0;

		for (i = 0; i < c->nbufs; i++)
			dma_free_coherent(dev, c->bufs[i].size, c->bufs[i].cpu,
					  c->bufs[i].dma);
		kfree(c->bufs);
		c->bufs = NULL;
		c->nbufs = 0;
		if (chunk <= PAGE_SIZE || chunk / 2 < min_chunk)
			return -ENOMEM;
		chunk /= 2;
	}
}

static int vgpu_stage_copy_in(struct vgpu_bcmd *c, const void __user *src)
{
	u64 off = 0;
	u32 i;

	for (i = 0; i < c->nbufs; i++) {
		if (copy_from_user(c->bufs[i].cpu, src + off, c->bufs[i].len))
			return -EFAULT;
		off += c->bufs[i].len;
	}
	return 0;
}

/*
 * Turns bytes [@skip, @skip + @size) of a DMA-mapped table into the
 * device's scatter-gather list: inline in the command slot when short,
 * else in a coherent buffer split into pieces of at most
 * VGPU_MAX_SG_ENTRIES entries (one device command each).
 */
static int vgpu_sg_entries(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			   struct sg_table *sgt, u64 skip, u64 size)
{
	u64 end = skip + size, pos = 0;
	struct vgpu_sg_entry *ents;
	struct scatterlist *sg;
	unsigned int i, n = 0;
	int ret;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		u64 start = pos;

		pos += sg_dma_len(sg);
		if (pos <= skip)
			continue;
		if (start >= end)
			break;
		n++;
	}
	if (!n)
		return -EFAULT;
	c->nents = n;
	c->size = size;
	c->npieces = DIV_ROUND_UP(n, VGPU_MAX_SG_ENTRIES);

	if (n <= VGPU_INLINE_SG) {
		ents = (struct vgpu_sg_entry *)c->inl;
		c->inl_len = n * sizeof(*ents);
	} else {
		ret = vgpu_stage_alloc(vdev, c, (u64)n * sizeof(*ents), 1);
		if (ret)
			return ret;
		ents = c->bufs[0].cpu;
		if (c->npieces > 1) {
			c->piece_len = kcalloc(c->npieces, sizeof(u64),
					       GFP_KERNEL);
			if (!c->piece_len)
				return -ENOMEM;
		}
	}
	n = 0;
	pos = 0;
	for_each_sgtable_dma_sg(sgt, sg, i) {
		u64 start = pos, from, to;

		pos += sg_dma_len(sg);
		if (pos <= skip)
			continue;
		if (start >= end)
			break;
		from = max(start, skip);
		to = min(pos, end);
		ents[n].addr = sg_dma_address(sg) + (from - start);
		ents[n].len = to - from;
		if (c->piece_len)
			c->piece_len[n / VGPU_MAX_SG_ENTRIES] += to - from;
		n++;
	}
	c->ndesc = c->npieces * 3;
	return 0;
}

/* Pins the user side of a COPY and maps it for DMA, for this copy alone. */
static int vgpu_prep_user_side(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			       u64 uaddr, u64 size, bool to_device)
{
	struct device *dev = &vdev->pdev->dev;
	unsigned int off = offset_in_page(uaddr);
	long npages, pinned;
	u64 end;
	int ret;

	if (check_add_overflow(uaddr, size, &end) ||
	    !access_ok(u64_to_user_ptr(uaddr), size))
		return -EFAULT;
	npages = DIV_ROUND_UP(off + size, PAGE_SIZE);
	c->pages = kvmalloc_array(npages, sizeof(*c->pages), GFP_KERNEL);
	if (!c->pages)
		return -ENOMEM;
	pinned = pin_user_pages_fast(uaddr & PAGE_MASK, npages,
				     to_device ? 0 : FOLL_WRITE, c->pages);
	if (pinned < 0) {
		kvfree(c->pages);
		c->pages = NULL;
		return pinned;
	}
	c->npages = pinned;
	if (pinned != npages)
		return -EFAULT;
	c->dirty = !to_device;
	c->dir = to_device ? DMA_TO_DEVICE : DMA_FROM_DEVICE;

	ret = sg_alloc_table_from_pages_segment(&c->sgt, c->pages, npages, off,
						size,
						ALIGN_DOWN(dma_get_max_seg_size(dev), PAGE_SIZE),
						GFP_KERNEL);
	if (ret)
		return ret;
	ret = dma_map_sgtable(dev, &c->sgt, c->dir, 0);
	if (ret)
		return ret;
	c->mapped = true;
	return vgpu_sg_entries(vdev, c, &c->sgt, 0, size);
}

/* ---- pinned ranges -------------------------------------------------------- */

static void vgpu_pinned_release(struct kref *ref)
{
	struct vgpu_pinned *p = container_of(ref, struct vgpu_pinned, ref);

	dma_unmap_sgtable(&p->vdev->pdev->dev, &p->sgt, DMA_BIDIRECTIONAL, 0);
	sg_free_table(&p->sgt);
	/* The device may have written any of it. */
	unpin_user_pages_dirty_lock(p->pages, p->npages, true);
	kvfree(p->pages);
	vgpu_dev_put(p->vdev);
	kfree(p);
}

/* Process context: the last reference unpins pages. */
void vgpu_pinned_put(struct vgpu_pinned *p)
{
	kref_put(&p->ref, vgpu_pinned_release);
}

/* The file's pinned range holding [@uaddr, @uaddr + @size), referenced. */
static struct vgpu_pinned *vgpu_pinned_find(struct vgpu_file *vf, u64 uaddr,
					    u64 size)
{
	struct vgpu_pinned *p, *found = NULL;

	mutex_lock(&vf->pin_lock);
	list_for_each_entry(p, &vf->pinned, link) {
		if (uaddr >= p->uaddr && uaddr - p->uaddr <= p->size &&
		    size <= p->size - (uaddr - p->uaddr)) {
			kref_get(&p->ref);
			found = p;
			break;
		}
	}
	mutex_unlock(&vf->pin_lock);
	return found;
}

static long vgpu_ioctl_pin(struct vgpu_file *vf, void __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct device *dev = &vdev->pdev->dev;
	struct vgpu_pinned *p, *q;
	struct vgpu_pin a;
	long npages, got;
	u64 end;
	int ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (!a.size || !PAGE_ALIGNED(a.addr) || !PAGE_ALIGNED(a.size))
		return -EINVAL;
	if (check_add_overflow(a.addr, a.size, &end) ||
	    !access_ok(u64_to_user_ptr(a.addr), a.size))
		return -EFAULT;
	npages = a.size >> PAGE_SHIFT;
	if (npages > totalram_pages() / 2)
		return -ENOMEM;

	p = kzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	kref_init(&p->ref);
	p->uaddr = a.addr;
	p->size = a.size;
	p->pages = kvmalloc_array(npages, sizeof(*p->pages), GFP_KERNEL);
	if (!p->pages) {
		kfree(p);
		return -ENOMEM;
	}

	mutex_lock(&vf->pin_lock);
	ret = -ENOSPC;
	if (vf->npinned >= VGPU_MAX_PINNED_RANGES)
		goto unlock;
	ret = -ENOMEM;
	if (vf->pinned_pages + npages > totalram_pages() / 2)
		goto unlock;
	ret = -EEXIST;
	list_for_each_entry(q, &vf->pinned, link)
		if (a.addr < q->uaddr + q->size && q->uaddr < end)
			goto unlock;

	got = pin_user_pages_fast(a.addr, npages, FOLL_WRITE | FOLL_LONGTERM,
				  p->pages);
	if (got != npages) {
		if (got > 0)
			unpin_user_pages(p->pages, got);
		ret = got < 0 ? got : -EFAULT;
		goto unlock;
	}
	ret = sg_alloc_table_from_pages_segment(&p->sgt, p->pages, npages, 0,
						a.size,
						ALIGN_DOWN(dma_get_max_seg_size(dev), PAGE_SIZE),
						GFP_KERNEL);
	if (ret)
		goto unpin;
	ret = dma_map_sgtable(dev, &p->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto free_sgt;
	p->npages = npages;
	p->need_sync = dma_need_sync(dev, sg_dma_address(p->sgt.sgl));
	kref_get(&vdev->ref);
	p->vdev = vdev;
	list_add(&p->link, &vf->pinned);
	vf->npinned++;
	vf->pinned_pages += npages;
	mutex_unlock(&vf->pin_lock);
	return 0;

free_sgt:
	sg_free_table(&p->sgt);
unpin:
	unpin_user_pages(p->pages, npages);
unlock:
	mutex_unlock(&vf->pin_lock);
	kvfree(p->pages);
	kfree(p);
	return ret;
}

static void vgpu_unpin_locked(struct vgpu_file *vf, struct vgpu_pinned *p)
{
	list_del(&p->link);
	vf->npinned--;
	vf->pinned_pages -= p->npages;
}

static long vgpu_ioctl_unpin(struct vgpu_file *vf, void __user *arg)
{
	struct vgpu_pinned *p, *found = NULL;
	struct vgpu_pin a;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	if (a.size)
		return -EINVAL;
	mutex_lock(&vf->pin_lock);
	list_for_each_entry(p, &vf->pinned, link) {
		if (p->uaddr == a.addr) {
			vgpu_unpin_locked(vf, p);
			found = p;
			break;
		}
	}
	mutex_unlock(&vf->pin_lock);
	if (!found)
		return -ENOENT;
	/* Copies still using it hold their own references. */
	vgpu_pinned_put(found);
	return 0;
}

/* Close: the file's ranges go once no copy uses them. */
void vgpu_unpin_all(struct vgpu_file *vf)
{
	struct vgpu_pinned *p, *tmp;

	mutex_lock(&vf->pin_lock);
	list_for_each_entry_safe(p, tmp, &vf->pinned, link) {
		vgpu_unpin_locked(vf, p);
		vgpu_pinned_put(p);
	}
	mutex_unlock(&vf->pin_lock);
}

static u32 vgpu_copy_kind(u32 kind)
{
	switch (kind) {
	case VGPU_MEM_USER:
		return VGPU_COPY_GUEST;
	case VGPU_MEM_DEVICE:
		return VGPU_COPY_DEVICE;
	default:
		return VGPU_COPY_WINDOW;
	}
}

static int vgpu_prep_copy(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			  const struct vgpu_cmd *u, struct vgpu_budget *bud)
{
	const struct vgpu_copy_args *a = &u->copy;
	struct vgpu_cmd_copy *d = &c->dcmd.copy;
	u32 sk = a->src_kind, dk = a->dst_kind;
	bool ok;

	if (u->flags || !vgpu_args_tail_zero(u, sizeof(*a)) || !a->size)
		return -EINVAL;
	ok = (sk == VGPU_MEM_DEVICE && dk <= VGPU_MEM_WINDOW) ||
	     (dk == VGPU_MEM_DEVICE && sk <= VGPU_MEM_WINDOW);
	if (!ok)
		return -EINVAL;

	if (sk == VGPU_MEM_WINDOW || dk == VGPU_MEM_WINDOW) {
		u64 off = sk == VGPU_MEM_WINDOW ? a->src : a->dst;

		if (!vdev->win_dev_size)
			return -EOPNOTSUPP;
		if (off > vdev->win_dev_size ||
		    a->size > vdev->win_dev_size - off)
			return -ERANGE;
	}

	d->hdr.opcode = VGPU_OP_COPY;
	d->src_kind = vgpu_copy_kind(sk);
	d->dst_kind = vgpu_copy_kind(dk);
	d->src = sk == VGPU_MEM_USER ? 0 : a->src;
	d->dst = dk == VGPU_MEM_USER ? 0 : a->dst;
	d->size = a->size;
	c->dlen = sizeof(*d);

	if (sk == VGPU_MEM_USER || dk == VGPU_MEM_USER) {
		u64 uaddr = sk == VGPU_MEM_USER ? a->src : a->dst;
		bool to_device = sk == VGPU_MEM_USER;
		struct vgpu_pinned *p;
		int ret;

		if (a->size > VGPU_MAX_COPY_BYTES)
			return -E2BIG;
		p = vgpu_pinned_find(vgpu_res_file(bud->vf), uaddr, a->size);
		if (p) {
			/* Released with the batch, which then syncs for the CPU. */
			c->pinned = p;
			c->dirty = !to_device;
			if (p->need_sync)
				dma_sync_sgtable_for_device(&vdev->pdev->dev,
							    &p->sgt,
							    DMA_BIDIRECTIONAL);
			ret = vgpu_sg_entries(vdev, c, &p->sgt,
					      uaddr - p->uaddr, a->size);
		} else {
			if (a->size > VGPU_MAX_BATCH_PIN_BYTES - bud->pinned)
				return -E2BIG;
			bud->pinned += a->size;
			ret = vgpu_prep_user_side(vdev, c, uaddr, a->size,
						  to_device);
		}
		if (ret)
			return ret;
		d->sg_count = c->nents;
		return 0;
	}
	c->npieces = 1;
	c->ndesc = 2;
	return 0;
}

/*
 * Stages @len bytes from user memory as one data descriptor: inline in
 * the slot when they fit, else in a coherent buffer.
 */
static int vgpu_stage_small(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			    const void __user *src, u32 len)
{
	int ret;

	c->ndesc++;
	if (len <= VGPU_SLOT_DATA_BYTES) {
		if (copy_from_user(c->inl, src, len))
			return -EFAULT;
		c->inl_len = len;
		return 0;
	}
	ret = vgpu_stage_alloc(vdev, c, len, 1);
	if (ret)
		return ret;
	return vgpu_stage_copy_in(c, src);
}

/*
 * A function handle in its first 8 bytes, the cluster shape in the next
 * 12 (the device checks it), the rest zero.
 */
static bool vgpu_entry_is_function(const char *entry)
{
	u64 handle;
	size_t i;

	memcpy(&handle, entry, sizeof(handle));
	for (i = sizeof(handle) + 3 * sizeof(u32); i < VGPU_ENTRY_NAME_LEN; i++)
		if (entry[i])
			return false;
	return le64_to_cpu((__force __le64)handle) != 0;
}

static int vgpu_prep_launch(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			    const struct vgpu_cmd *u, struct vgpu_budget *bud)
{
	const struct vgpu_launch_args *a = &u->launch;
	struct vgpu_cmd_launch *d = &c->dcmd.launch;
	const u32 allowed = VGPU_CMD_LAUNCH_FUNCTION |
			    VGPU_CMD_LAUNCH_COOPERATIVE;

	if ((u->flags & ~allowed) || !vgpu_args_tail_zero(u, sizeof(*a)))
		return -EINVAL;
	if ((u->flags & VGPU_CMD_LAUNCH_COOPERATIVE) &&
	    !(vdev->features & VGPU_FEATURE_COOPERATIVE))
		return -EOPNOTSUPP;
	if (u->flags & VGPU_CMD_LAUNCH_FUNCTION) {
		if (!(vdev->features & VGPU_FEATURE_FUNC_INFO))
			return -EOPNOTSUPP;
		/* The built-in kernels' blocks are checked by name. */
		if (a->module == VGPU_MODULE_BUILTIN_ID ||
		    !vgpu_entry_is_function(a->entry))
			return -EINVAL;
	} else if (!a->entry[0] || !memchr(a->entry, 0, sizeof(a->entry))) {
		return -EINVAL;
	}
	if (a->params_size > VGPU_MAX_PARAMS_BYTES)
		return -E2BIG;
	if (a->params_size > VGPU_MAX_BATCH_STAGED_BYTES - bud->staged)
		return -E2BIG;
	bud->staged += a->params_size;

	d->hdr.opcode = VGPU_OP_LAUNCH;
	d->hdr.flags = u->flags & allowed;
	d->module = a->module;
	memcpy(d->grid, a->grid, sizeof(d->grid));
	memcpy(d->block, a->block, sizeof(d->block));
	d->shared_mem = a->shared_mem;
	d->params_size = a->params_size;
	memcpy(d->entry, a->entry, sizeof(d->entry));
	c->dlen = sizeof(*d);
	c->npieces = 1;
	c->ndesc = 2;

	if (!a->params_size)
		return 0;
	return vgpu_stage_small(vdev, c, u64_to_user_ptr(a->params),
				a->params_size);
}

static int vgpu_prep_func_info(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			       const struct vgpu_cmd *u,
			       struct vgpu_budget *bud)
{
	const struct vgpu_func_info_args *a = &u->func_info;
	struct vgpu_cmd_func_info *d = &c->dcmd.func_info;
	bool global = u->flags & VGPU_CMD_FUNC_INFO_GLOBAL;

	if ((u->flags & ~VGPU_CMD_FUNC_INFO_GLOBAL) ||
	    !vgpu_args_tail_zero(u, sizeof(*a)))
		return -EINVAL;
	if (!(vdev->features & VGPU_FEATURE_FUNC_INFO))
		return -EOPNOTSUPP;
	if (a->module == VGPU_MODULE_BUILTIN_ID || !a->name_len ||
	    a->out_size < (global ? sizeof(struct vgpu_global_info) :
				    sizeof(struct vgpu_func_info)))
		return -EINVAL;
	if (a->name_len > VGPU_MAX_FUNC_NAME_BYTES)
		return -E2BIG;
	if (a->name_len > VGPU_MAX_BATCH_STAGED_BYTES - bud->staged)
		return -E2BIG;
	bud->staged += a->name_len;

	if (global) {
		/* The global becomes memory of the file when it completes. */
		c->res = kzalloc(sizeof(*c->res), GFP_KERNEL);
		if (!c->res)
			return -ENOMEM;
		c->res->global = true;
		c->res->owner = a->module;
	}
	d->hdr.opcode = VGPU_OP_FUNC_INFO;
	d->hdr.flags = global ? VGPU_FUNC_INFO_FLAG_GLOBAL : 0;
	d->module = a->module;
	d->out = a->out;
	d->out_size = a->out_size;
	d->name_len = a->name_len;
	c->dlen = sizeof(*d);
	c->npieces = 1;
	c->ndesc = 2;
	return vgpu_stage_small(vdev, c, u64_to_user_ptr(a->name), a->name_len);
}

static int vgpu_prep_occupancy(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			       const struct vgpu_cmd *u)
{
	const struct vgpu_occupancy_args *a = &u->occupancy;
	struct vgpu_cmd_occupancy *d = &c->dcmd.occupancy;

	if (u->flags || a->pad || !vgpu_args_tail_zero(u, sizeof(*a)))
		return -EINVAL;
	if (!(vdev->features & VGPU_FEATURE_OCCUPANCY))
		return -EOPNOTSUPP;
	/* The device checks the shape against the function's limits. */
	if (a->module == VGPU_MODULE_BUILTIN_ID || !a->function)
		return -EINVAL;

	d->hdr.opcode = VGPU_OP_OCCUPANCY;
	d->module = a->module;
	d->function = a->function;
	memcpy(d->block, a->block, sizeof(d->block));
	d->shared_mem = a->shared_mem;
	memcpy(d->cluster, a->cluster, sizeof(d->cluster));
	c->dlen = sizeof(*d);
	return 0;
}

static int vgpu_prep_console(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			     const struct vgpu_cmd *u, struct vgpu_budget *bud)
{
	const struct vgpu_console_args *a = &u->console;
	struct vgpu_cmd_console *d = &c->dcmd.console;
	int ret;

	if (u->flags || a->pad || !vgpu_args_tail_zero(u, sizeof(*a)))
		return -EINVAL;
	if (!(vdev->features & VGPU_FEATURE_CONSOLE))
		return -EOPNOTSUPP;
	if (a->module == VGPU_MODULE_BUILTIN_ID || !a->out_size ||
	    a->out_size > VGPU_MAX_CONSOLE_BYTES)
		return -EINVAL;
	if (a->out_size > VGPU_MAX_BATCH_PIN_BYTES - bud->pinned)
		return -E2BIG;
	bud->pinned += a->out_size;

	d->hdr.opcode = VGPU_OP_CONSOLE;
	d->module = a->module;
	d->out_size = a->out_size;
	c->dlen = sizeof(*d);
	/* The output goes to the caller's memory, as a COPY's would. */
	ret = vgpu_prep_user_side(vdev, c, a->out, a->out_size, false);
	if (ret)
		return ret;
	d->sg_count = c->nents;
	return 0;
}

static int vgpu_prep_module_load(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
				 const struct vgpu_cmd *u,
				 struct vgpu_budget *bud)
{
	const struct vgpu_module_load_args *a = &u->module_load;
	struct vgpu_cmd_module_load *d = &c->dcmd.module_load;
	int ret;

	if (u->flags || a->pad || !vgpu_args_tail_zero(u, sizeof(*a)) ||
	    !a->image_size)
		return -EINVAL;
	if (a->image_size > VGPU_MAX_IMAGE_BYTES ||
	    a->image_size > VGPU_MAX_BATCH_STAGED_BYTES - bud->staged)
		return -E2BIG;
	bud->staged += a->image_size;

	c->res = kzalloc(sizeof(*c->res), GFP_KERNEL);
	if (!c->res)
		return -ENOMEM;
	c->res->module = true;

	d->hdr.opcode = VGPU_OP_MODULE_LOAD;
	d->format = a->format;
	d->image_size = a->image_size;
	c->dlen = sizeof(*d);

	ret = vgpu_stage_alloc(vdev, c, a->image_size, VGPU_MAX_DATA_DESCS);
	if (ret)
		return ret;
	ret = vgpu_stage_copy_in(c, u64_to_user_ptr(a->image));
	if (ret)
		return ret;
	c->npieces = 1;
	c->ndesc = 2 + c->nbufs;
	return 0;
}

/* The DMA address of byte @off of a mapped table, or DMA_MAPPING_ERROR. */
static dma_addr_t vgpu_sgt_dma_at(struct sg_table *sgt, u64 off)
{
	struct scatterlist *sg;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		if (off < sg_dma_len(sg))
			return sg_dma_address(sg) + off;
		off -= sg_dma_len(sg);
	}
	return DMA_MAPPING_ERROR;
}

/*
 * WRITE_VALUE and WAIT_VALUE: the word must lie in a pinned range, whose
 * reference the command keeps until it completes.
 */
static int vgpu_prep_value(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			   const struct vgpu_cmd *u, struct vgpu_budget *bud)
{
	const struct vgpu_value_args *a = &u->value;
	u32 allowed = VGPU_CMD_VALUE_32;
	u32 len = u->flags & VGPU_CMD_VALUE_32 ? 4 : 8;
	struct vgpu_pinned *p;
	dma_addr_t dma;

	if (!(vdev->features & VGPU_FEATURE_VALUES))
		return -EOPNOTSUPP;
	if (u->opcode == VGPU_CMD_WAIT_VALUE)
		allowed |= VGPU_WAIT_COND_MASK;
	if ((u->flags & ~allowed) || !IS_ALIGNED(a->addr, len) ||
	    !vgpu_args_tail_zero(u, sizeof(*a)))
		return -EINVAL;
	p = vgpu_pinned_find(vgpu_res_file(bud->vf), a->addr, len);
	if (!p)
		return -EFAULT;
	/* Released with the batch, which then syncs a written word. */
	c->pinned = p;
	c->dirty = u->opcode == VGPU_CMD_WRITE_VALUE;
	dma = vgpu_sgt_dma_at(&p->sgt, a->addr - p->uaddr);
	if (dma == DMA_MAPPING_ERROR)
		return -EFAULT;
	if (p->need_sync)
		dma_sync_sgtable_for_device(&vdev->pdev->dev, &p->sgt,
					    DMA_BIDIRECTIONAL);
	c->dcmd.value.hdr.flags = u->flags;
	c->dcmd.value.addr = dma;
	c->dcmd.value.value = a->value;
	c->dlen = sizeof(struct vgpu_cmd_value);
	return 0;
}

/*
 * ARRAY_CREATE, ARRAY_COPY, OBJECT_CREATE, OBJECT_DESTROY: the device's
 * command is the arguments after a header. Arrays and objects are a
 * device context's own, so they need contexts: the device then refuses
 * every handle and address that is not the file's context's, and frees
 * what the process left when its context ends.
 */
static int vgpu_prep_resource(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			      const struct vgpu_cmd *u)
{
	size_t len;
	bool flags_ok;

	switch (u->opcode) {
	case VGPU_CMD_ARRAY_CREATE:
		len = sizeof(u->array);
		flags_ok = !(u->flags & ~(VGPU_CMD_ARRAY_LAYERED |
					  VGPU_CMD_ARRAY_SURFACE |
					  VGPU_CMD_ARRAY_CUBEMAP));
		break;
	case VGPU_CMD_ARRAY_COPY:
		len = sizeof(u->array_copy);
		flags_ok = !(u->flags & ~(VGPU_CMD_COPY_SRC_ARRAY |
					  VGPU_CMD_COPY_DST_ARRAY)) &&
			   !u->array_copy.pad;
		break;
	case VGPU_CMD_OBJECT_CREATE:
		len = sizeof(u->object);
		flags_ok = u->flags == VGPU_OBJ_TEXTURE ||
			   u->flags == VGPU_OBJ_SURFACE;
		break;
	default:
		len = sizeof(u->object_destroy);
		flags_ok = u->flags <= VGPU_OBJ_SURFACE;
		break;
	}
	if (!flags_ok || !vgpu_args_tail_zero(u, len))
		return -EINVAL;
	if (!(vdev->features & VGPU_FEATURE_ARRAYS) || !vdev->contexts)
		return -EOPNOTSUPP;
	c->dcmd.hdr.flags = u->flags;
	memcpy((u8 *)&c->dcmd + sizeof(struct vgpu_cmd_hdr), u->raw, len);
	c->dlen = sizeof(struct vgpu_cmd_hdr) + len;
	return 0;
}

/* The commands a lane takes: work of a stream, none of resources. */
static bool vgpu_lane_cmd(u32 opcode)
{
	switch (opcode) {
	case VGPU_CMD_NOP:
	case VGPU_CMD_FENCE:
	case VGPU_CMD_COPY:
	case VGPU_CMD_ARRAY_COPY:
	case VGPU_CMD_FILL:
	case VGPU_CMD_LAUNCH:
	case VGPU_CMD_TIMESTAMP:
	case VGPU_CMD_WRITE_VALUE:
	case VGPU_CMD_WAIT_VALUE:
		return true;
	default:
		return false;
	}
}

/* Checks a command and stages its data. No locks held but hw_lock. */
static int vgpu_prep_cmd(struct vgpu_dev *vdev, struct vgpu_bcmd *c,
			 const struct vgpu_cmd *u, struct vgpu_budget *bud)
{
	if (bud->vf->owner && !vgpu_lane_cmd(u->opcode))
		return -EINVAL;
	c->npieces = 1;
	c->ndesc = 2;
	c->dcmd.hdr.opcode = u->opcode;
	c->dlen = sizeof(struct vgpu_cmd_hdr);

	switch (u->opcode) {
	case VGPU_CMD_NOP:
		if (u->flags || !vgpu_args_tail_zero(u, 0))
			return -EINVAL;
		return 0;
	case VGPU_CMD_TIMESTAMP:
		if (u->flags || !vgpu_args_tail_zero(u, 0))
			return -EINVAL;
		if (!(vdev->features & VGPU_FEATURE_TIMESTAMP))
			return -EOPNOTSUPP;
		return 0;
	case VGPU_CMD_FENCE:
		if ((u->flags & ~VGPU_CMD_FENCE_IRQ) ||
		    !vgpu_args_tail_zero(u, 0))
			return -EINVAL;
		if (u->flags & VGPU_CMD_FENCE_IRQ)
			c->dcmd.fence.hdr.flags = VGPU_FENCE_FLAG_IRQ;
		c->dlen = sizeof(struct vgpu_cmd_fence);
		return 0;
	case VGPU_CMD_COPY:
		return vgpu_prep_copy(vdev, c, u, bud);
	case VGPU_CMD_FILL:
		if (u->flags || u->fill.pad ||
		    !vgpu_args_tail_zero(u, sizeof(u->fill)) ||
		    !u->fill.size || u->fill.size % 4)
			return -EINVAL;
		c->dcmd.fill.addr = u->fill.addr;
		c->dcmd.fill.size = u->fill.size;
		c->dcmd.fill.pattern = u->fill.pattern;
		c->dlen = sizeof(struct vgpu_cmd_fill);
		return 0;
	case VGPU_CMD_MODULE_LOAD:
		return vgpu_prep_module_load(vdev, c, u, bud);
	case VGPU_CMD_MODULE_UNLOAD:
		if (u->flags || !vgpu_args_tail_zero(u, sizeof(u->module_unload)))
			return -EINVAL;
		if (u->module_unload.module == VGPU_MODULE_BUILTIN_ID)
			return -EINVAL;
		c->dcmd.module_unload.module = u->module_unload.module;
		c->dlen = sizeof(struct vgpu_cmd_module_unload);
		return 0;
	case VGPU_CMD_LAUNCH:
		return vgpu_prep_launch(vdev, c, u, bud);
	case VGPU_CMD_FUNC_INFO:
		return vgpu_prep_func_info(vdev, c, u, bud);
	case VGPU_CMD_OCCUPANCY:
		return vgpu_prep_occupancy(vdev, c, u);
	case VGPU_CMD_CONSOLE:
		return vgpu_prep_console(vdev, c, u, bud);
	case VGPU_CMD_WRITE_VALUE:
	case VGPU_CMD_WAIT_VALUE:
		return vgpu_prep_value(vdev, c, u, bud);
	case VGPU_CMD_ARRAY_CREATE:
	case VGPU_CMD_ARRAY_COPY:
	case VGPU_CMD_OBJECT_CREATE:
	case VGPU_CMD_OBJECT_DESTROY:
		return vgpu_prep_resource(vdev, c, u);
	default:
		/* MEM_ALLOC and MEM_FREE go through their own ioctls. */
		return -EINVAL;
	}
}

/* ---- ownership checks ----------------------------------------------------- */

struct vgpu_range {
	u64 addr;
	u64 len;
};

static int vgpu_words(u64 n, u64 *bytes)
{
	return check_mul_overflow(n, 4ULL, bytes) ? -ERANGE : 0;
}

/*
 * The built-in kernels take device pointers in their parameter blocks:
 * every range they touch must belong to the file. Modules loaded by the
 * process take opaque blocks the driver cannot check (see README).
 */
static int vgpu_check_builtin(struct vgpu_file *vf, const char *entry,
			      const void *params, u32 size)
{
	struct vgpu_range r[3] = {};
	unsigned int n = 0, i;
	u64 mn, mk, kn;
	int ret = 0;

	if (!strcmp(entry, "fill_u32")) {
		struct vgpu_k_fill p;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		r[n].addr = p.dst;
		ret = vgpu_words(p.count, &r[n++].len);
	} else if (!strcmp(entry, "copy")) {
		struct vgpu_k_copy p;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		r[n++] = (struct vgpu_range){ p.dst, p.bytes };
		r[n++] = (struct vgpu_range){ p.src, p.bytes };
	} else if (!strcmp(entry, "vadd_f32")) {
		struct vgpu_k_vadd p;
		u64 len;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		ret = vgpu_words(p.n, &len);
		r[n++] = (struct vgpu_range){ p.c, len };
		r[n++] = (struct vgpu_range){ p.a, len };
		r[n++] = (struct vgpu_range){ p.b, len };
	} else if (!strcmp(entry, "saxpy_f32")) {
		struct vgpu_k_saxpy p;
		u64 len;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		ret = vgpu_words(p.n, &len);
		r[n++] = (struct vgpu_range){ p.y, len };
		r[n++] = (struct vgpu_range){ p.x, len };
	} else if (!strcmp(entry, "sgemm_f32")) {
		struct vgpu_k_sgemm p;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		mn = (u64)p.m * p.n;
		mk = (u64)p.m * p.k;
		kn = (u64)p.k * p.n;
		ret = vgpu_words(mn, &r[0].len) ?: vgpu_words(mk, &r[1].len) ?:
		      vgpu_words(kn, &r[2].len);
		r[0].addr = p.c;
		r[1].addr = p.a;
		r[2].addr = p.b;
		n = 3;
	} else if (!strcmp(entry, "reduce_sum_f32")) {
		struct vgpu_k_reduce p;

		if (size != sizeof(p))
			return -EINVAL;
		memcpy(&p, params, sizeof(p));
		r[n++] = (struct vgpu_range){ p.out, 4 };
		r[n].addr = p.input;
		ret = vgpu_words(p.n, &r[n++].len);
	} else {
		return -ENOENT;
	}

	for (i = 0; !ret && i < n; i++)
		ret = vgpu_check_dev_range(vf, r[i].addr, r[i].len);
	return ret;
}

/*
 * Checks that the device addresses and modules a command names belong to
 * the file. Under submit_lock, so no FREE of the file can slip in between
 * this check and the command reaching the ring.
 */
static int vgpu_check_cmd(struct vgpu_file *lf, const struct vgpu_cmd *u,
			  struct vgpu_bcmd *c)
{
	/* A lane's commands use its owner's resources. */
	struct vgpu_file *vf = vgpu_res_file(lf);
	const struct vgpu_launch_args *l = &u->launch;
	struct vgpu_res *m;
	unsigned long flags;
	const void *params;
	int ret = 0;

	switch (u->opcode) {
	case VGPU_CMD_COPY:
		if (u->copy.src_kind == VGPU_MEM_DEVICE)
			ret = vgpu_check_dev_range(vf, u->copy.src, u->copy.size);
		if (!ret && u->copy.dst_kind == VGPU_MEM_DEVICE)
			ret = vgpu_check_dev_range(vf, u->copy.dst, u->copy.size);
		return ret;
	case VGPU_CMD_FILL:
		return vgpu_check_dev_range(vf, u->fill.addr, u->fill.size);
	case VGPU_CMD_MODULE_UNLOAD:
		spin_lock_irqsave(&vf->res_lock, flags);
		m = vgpu_module_find(vf, u->module_unload.module);
		if (m)
			m->dying = true;
		spin_unlock_irqrestore(&vf->res_lock, flags);
		return m ? 0 : -ENOENT;
	case VGPU_CMD_FUNC_INFO:
		ret = vgpu_module_owned(vf, u->func_info.module);
		if (ret)
			return ret;
		return vgpu_check_dev_range(vf, u->func_info.out,
					    u->func_info.out_size);
	case VGPU_CMD_OCCUPANCY:
		return vgpu_module_owned(vf, u->occupancy.module);
	case VGPU_CMD_CONSOLE:
		/* A module's output is its own file's only. */
		return vgpu_module_owned(vf, u->console.module);
	case VGPU_CMD_LAUNCH:
		if (l->module != VGPU_MODULE_BUILTIN_ID)
			return vgpu_module_owned(vf, l->module);
		params = c->inl_len ? (const void *)c->inl :
			 c->nbufs ? c->bufs[0].cpu : NULL;
		return vgpu_check_builtin(vf, l->entry, params, l->params_size);
	default:
		return 0;
	}
}

/* ---- fences and results ------------------------------------------------------ */

static bool vgpu_fence_done(struct vgpu_file *vf, u64 seq)
{
	/* The fence before the results: pairs with vgpu_batch_complete(). */
	return seq <= smp_load_acquire(&vf->done_seq);
}

static bool vgpu_batch_done(struct vgpu_batch *b)
{
	/* done before the results: pairs with vgpu_batch_complete(). */
	return smp_load_acquire(&b->done);
}

static int vgpu_wait_fence(struct vgpu_file *vf, u64 seq, u64 timeout_ns)
{
	long ret;

	if (vgpu_fence_done(vf, seq))
		return 0;

	if (vf->q->polled && vgpu_poll_spin_us && timeout_ns) {
		u64 spin = min_t(u64, (u64)vgpu_poll_spin_us * NSEC_PER_USEC,
				 timeout_ns);
		u64 end = ktime_get_ns() + spin;

		do {
			vgpu_queue_reap(vf->q);
			if (vgpu_fence_done(vf, seq))
				return 0;
			cpu_relax();
		} while (ktime_get_ns() < end && !need_resched() &&
			 !signal_pending(current));
	}
	if (!timeout_ns)
		return -ETIMEDOUT;

	if (timeout_ns == VGPU_TIMEOUT_INFINITE) {
		ret = wait_event_interruptible(vf->wq, vgpu_fence_done(vf, seq));
	} else {
		ktime_t limit = ns_to_ktime(min_t(u64, timeout_ns, KTIME_MAX));

		ret = wait_event_interruptible_hrtimeout(vf->wq,
							 vgpu_fence_done(vf, seq),
							 limit);
	}
	if (ret == -ETIME)
		return -ETIMEDOUT;
	if (ret == -ERESTARTSYS)
		return -EINTR;
	return ret;
}

static int vgpu_copy_results(struct vgpu_cmd __user *ucmds,
			     const struct vgpu_batch *b)
{
	u32 i;

	for (i = 0; i < b->ncmds; i++) {
		const struct vgpu_bcmd *c = &b->cmds[i];
		struct vgpu_cmd_out o = {
			.status = c->status,
			.error = c->error,
			.result = c->result,
			.device_ns = c->device_ns,
			.result2 = c->result2,
		};

		if (copy_to_user(&ucmds[i].status, &o, sizeof(o)))
			return -EFAULT;
	}
	return 0;
}

static void vgpu_report_error(const struct vgpu_batch *b, struct vgpu_wait *w)
{
	u32 i;

	if (w->error)
		return;
	for (i = 0; i < b->ncmds; i++) {
		if (b->cmds[i].error) {
			w->error = b->cmds[i].error;
			w->error_index = i;
			w->error_fence = b->seq;
			return;
		}
	}
}

/* Drops the fence table's reference if nobody collected it meanwhile. */
static bool vgpu_uncollect(struct vgpu_file *vf, u64 seq, struct vgpu_batch *b)
{
	if (xa_cmpxchg(&vf->batches, seq, b, NULL, 0) != b)
		return false;
	atomic_dec(&vf->nrecords);
	return true;
}

/*
 * Collects a completed fence: copies its results to ucmds (if given) and
 * forgets it; with all, also every earlier uncollected fence. The first
 * failed command (lowest fence first) is reported in w.
 */
static int vgpu_collect(struct vgpu_file *vf, u64 seq, bool all,
			struct vgpu_cmd __user *ucmds, u32 count,
			struct vgpu_wait *w)
{
	struct vgpu_batch *b, *e;
	unsigned long idx;
	int ret = 0;

	w->error_fence = 0;
	w->error_index = VGPU_NO_INDEX;
	w->error = 0;

	xa_lock(&vf->batches);
	b = xa_load(&vf->batches, seq);
	if (b)
		kref_get(&b->ref);
	xa_unlock(&vf->batches);

	if (ucmds) {
		if (!b)
			return -ENOENT;
		if (count != b->ncmds) {
			ret = -EINVAL;
			goto out;
		}
		ret = vgpu_copy_results(ucmds, b);
		if (ret)
			goto out;
	}

	if (all && seq > 1) {
		xa_for_each_range(&vf->batches, idx, e, 1, seq - 1) {
			if (!vgpu_uncollect(vf, idx, e))
				continue;
			vgpu_report_error(e, w);
			vgpu_batch_put(e);
		}
	}
	if (b) {
		vgpu_report_error(b, w);
		if (vgpu_uncollect(vf, seq, b))
			vgpu_batch_put(b);
	}
out:
	if (b)
		vgpu_batch_put(b);
	return ret;
}

/* ---- ioctls ------------------------------------------------------------------ */

static long vgpu_ioctl_info(struct vgpu_file *vf, void __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct pci_dev *pdev = vdev->pdev;
	struct vgpu_info i = {
		.uapi_version = VGPU_UAPI_VERSION,
		.abi_version = vdev->version,
		.vendor_id = pdev->vendor,
		.device_id = pdev->device,
		.subsystem_vendor_id = pdev->subsystem_vendor,
		.subsystem_id = pdev->subsystem_device,
		.revision = pdev->revision,
		.pci_bus = pdev->bus->number,
		.pci_devfn = pdev->devfn,
		.pci_domain = pci_domain_nr(pdev->bus),
		.features = vdev->features,
		.mem_size = READ_ONCE(vdev->mem_size),
		.window_size = vdev->win_size,
		.compute_units = vdev->compute_units,
		.max_queues = vdev->max_queues,
		.queues = vdev->nq,
		.queue_size = vdev->qsize,
		.minor = vdev->minor,
	};

	if (vdev->polled)
		i.flags |= VGPU_INFO_POLLED;
	if (vdev->msix)
		i.flags |= VGPU_INFO_MSIX;
	if (vdev->win_size)
		i.flags |= VGPU_INFO_WINDOW;
	if (vdev->features & VGPU_FEATURE_FUNC_INFO)
		i.flags |= VGPU_INFO_FUNC_INFO;
	if (vdev->features & VGPU_FEATURE_OCCUPANCY)
		i.flags |= VGPU_INFO_OCCUPANCY;
	if (vdev->features & VGPU_FEATURE_CONSOLE)
		i.flags |= VGPU_INFO_CONSOLE;
	if (vdev->features & VGPU_FEATURE_VMM)
		i.flags |= VGPU_INFO_VMM;
	if (vdev->contexts) {
		i.flags |= VGPU_INFO_CONTEXTS;
		i.max_contexts = vdev->max_contexts;
		i.context_cost = vdev->context_cost;
	}
	return copy_to_user(arg, &i, sizeof(i)) ? -EFAULT : 0;
}

/* Waits until a driver-internal batch completed; a fatal signal aborts. */
static int vgpu_wait_internal(struct vgpu_file *vf, struct vgpu_batch *b)
{
	if (wait_event_killable(vf->wq, vgpu_batch_done(b)))
		return -EINTR;
	return 0;
}

static struct vgpu_batch *vgpu_single(struct vgpu_file *vf)
{
	struct vgpu_batch *b = vgpu_batch_alloc(vf->vdev, vf, 1);

	if (!b)
		return NULL;
	b->ndesc = 2;
	b->cmds[0].npieces = 1;
	b->cmds[0].ndesc = 2;
	return b;
}

static long vgpu_ioctl_alloc(struct vgpu_file *vf, struct vgpu_alloc __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_alloc a;
	struct vgpu_batch *b;
	struct vgpu_bcmd *c;
	long ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	/*
	 * The guest's early check, a subset of the device's rules (vgpud's
	 * vgpu_backend::rules): a size of 0 or an alignment that is not a
	 * power of two is refused by every backend too. The device's own
	 * limits, VGPU_ALLOC_MAX_ALIGN and VGPU_MAX_ALLOCATIONS, are left to
	 * it: it refuses a larger alignment with VGPU_STATUS_INVALID (-EINVAL
	 * here too) and one allocation too many with VGPU_STATUS_NO_MEMORY.
	 */
	if (a.flags || a.pad || !a.size || (a.align & (a.align - 1)))
		return -EINVAL;

	b = vgpu_single(vf);
	if (!b)
		return -ENOMEM;
	c = &b->cmds[0];
	c->dcmd.mem_alloc.hdr.opcode = VGPU_OP_MEM_ALLOC;
	c->dcmd.mem_alloc.size = a.size;
	c->dcmd.mem_alloc.align = a.align;
	c->dlen = sizeof(c->dcmd.mem_alloc);
	c->res = kzalloc(sizeof(*c->res), GFP_KERNEL);
	if (!c->res) {
		ret = -ENOMEM;
		goto put;
	}
	c->res->size = a.size;

	down_read(&vdev->hw_lock);
	if (vdev->dead) {
		ret = -ENODEV;
		goto unlock_hw;
	}
	ret = mutex_lock_killable(&vf->submit_lock);
	if (ret)
		goto unlock_hw;
	b->gen = READ_ONCE(vdev->gen);
	ret = vgpu_res_sync_gen(vf, b->gen);
	if (!ret)
		ret = vgpu_queue_submit(vf->q, b, true);
	mutex_unlock(&vf->submit_lock);
unlock_hw:
	up_read(&vdev->hw_lock);
	if (ret)
		goto put;

	/*
	 * Killed while waiting: the allocation, if it happens, is recorded
	 * at completion and freed when the file is closed.
	 */
	ret = vgpu_wait_internal(vf, b);
	if (ret)
		goto put;
	ret = c->error;
	if (!ret) {
		a.addr = c->result;
		if (copy_to_user(arg, &a, sizeof(a)))
			ret = -EFAULT;
	}
put:
	vgpu_batch_put(b);
	return ret;
}

static long vgpu_ioctl_free(struct vgpu_file *vf, struct vgpu_free __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_batch *b;
	struct vgpu_bcmd *c;
	struct vgpu_res *r;
	struct vgpu_free f;
	unsigned long flags;
	bool found;
	long ret;

	if (copy_from_user(&f, arg, sizeof(f)))
		return -EFAULT;

	b = vgpu_single(vf);
	if (!b)
		return -ENOMEM;
	c = &b->cmds[0];
	c->dcmd.mem_free.hdr.opcode = VGPU_OP_MEM_FREE;
	c->dcmd.mem_free.addr = f.addr;
	c->dlen = sizeof(c->dcmd.mem_free);

	down_read(&vdev->hw_lock);
	if (vdev->dead) {
		ret = -ENODEV;
		goto unlock_hw;
	}
	ret = mutex_lock_killable(&vf->submit_lock);
	if (ret)
		goto unlock_hw;
	b->gen = READ_ONCE(vdev->gen);
	ret = vgpu_res_sync_gen(vf, b->gen);
	if (ret)
		goto unlock;

	spin_lock_irqsave(&vf->res_lock, flags);
	r = vgpu_alloc_find(vf, f.addr);
	found = r && r->addr == f.addr;
	/* Globals go with their module, mappings with UNMAP. */
	ret = found && (r->global || r->mapping) ? -EINVAL :
	      found ? 0 : -ENOENT;
	spin_unlock_irqrestore(&vf->res_lock, flags);
	if (ret)
		goto unlock;

	/*
	 * Commands of the file already on the ring run before the MEM_FREE;
	 * later ones are checked against the table without the allocation.
	 */
	ret = vgpu_queue_submit(vf->q, b, true);
	if (!ret) {
		spin_lock_irqsave(&vf->res_lock, flags);
		r = vgpu_alloc_find(vf, f.addr);
		if (r && r->addr == f.addr && !r->global && !r->mapping) {
			rb_erase(&r->node, &vf->allocs);
			vf->mem_bytes -= r->size;
			vf->nallocs--;
		} else {
			r = NULL;
		}
		spin_unlock_irqrestore(&vf->res_lock, flags);
		kfree(r);
	}
unlock:
	mutex_unlock(&vf->submit_lock);
unlock_hw:
	up_read(&vdev->hw_lock);
	if (!ret)
		ret = vgpu_wait_internal(vf, b);
	if (!ret)
		ret = c->error;
	vgpu_batch_put(b);
	return ret;
}

/*
 * VGPU_IOCTL_VMM: one virtual memory command, waited for. What it makes
 * (a reservation, a physical allocation, a mapping) is recorded at its
 * completion, as ALLOC's allocation is; what it ends is forgotten once
 * the command is on the ring, as FREE's is, so that no later command of
 * the file can name it. A file names only its own (without device
 * contexts every file shares one address space on the device: these
 * checks are then all that keeps one file's memory from another).
 */
static int vgpu_vmm_prep(const struct vgpu_vmm *v, struct vgpu_bcmd *c)
{
	const u64 g = VGPU_VMM_GRANULE;
	bool with_access = v->op == VGPU_VMM_ACCESS;
	bool with_handle = v->op == VGPU_VMM_RELEASE || v->op == VGPU_VMM_MAP;

	if ((v->access && !with_access) || (v->handle && !with_handle) ||
	    (v->align && v->op != VGPU_VMM_RESERVE) ||
	    (v->offset && v->op != VGPU_VMM_MAP))
		return -EINVAL;
	if (v->op == VGPU_VMM_RELEASE ? v->size || v->addr :
	    !v->size || v->size % g)
		return -EINVAL;
	if (v->op != VGPU_VMM_RESERVE && v->op != VGPU_VMM_CREATE &&
	    v->op != VGPU_VMM_RELEASE && v->addr % g)
		return -EINVAL;

	switch (v->op) {
	case VGPU_VMM_RESERVE:
	case VGPU_VMM_FREE:
		if (v->align & (v->align - 1))
			return -EINVAL;
		c->dcmd.va.hdr.opcode = VGPU_OP_VA_RESERVE;
		c->dcmd.va.addr = v->addr;
		c->dcmd.va.size = v->size;
		c->dcmd.va.align = v->align;
		c->dlen = sizeof(c->dcmd.va);
		if (v->op == VGPU_VMM_FREE) {
			c->dcmd.va.hdr.flags = VGPU_VA_FLAG_FREE;
			return 0;
		}
		break;
	case VGPU_VMM_CREATE:
	case VGPU_VMM_RELEASE:
		if (v->addr)
			return -EINVAL;
		c->dcmd.mem_create.hdr.opcode = VGPU_OP_MEM_CREATE;
		c->dcmd.mem_create.size = v->size;
		c->dcmd.mem_create.handle = v->handle;
		c->dlen = sizeof(c->dcmd.mem_create);
		if (v->op == VGPU_VMM_RELEASE) {
			c->dcmd.mem_create.hdr.flags = VGPU_MEM_CREATE_FLAG_RELEASE;
			return 0;
		}
		break;
	case VGPU_VMM_MAP:
	case VGPU_VMM_UNMAP:
		if (v->offset % g)
			return -EINVAL;
		c->dcmd.mem_map.hdr.opcode = VGPU_OP_MEM_MAP;
		c->dcmd.mem_map.addr = v->addr;
		c->dcmd.mem_map.size = v->size;
		c->dcmd.mem_map.handle = v->handle;
		c->dcmd.mem_map.offset = v->offset;
		c->dlen = sizeof(c->dcmd.mem_map);
		if (v->op == VGPU_VMM_UNMAP) {
			c->dcmd.mem_map.hdr.flags = VGPU_MEM_MAP_FLAG_UNMAP;
			return 0;
		}
		break;
	case VGPU_VMM_ACCESS:
		if (v->access != VGPU_VMM_ACCESS_NONE &&
		    v->access != VGPU_VMM_ACCESS_READ &&
		    v->access != VGPU_VMM_ACCESS_RW)
			return -EINVAL;
		c->dcmd.mem_access.hdr.opcode = VGPU_OP_MEM_ACCESS;
		c->dcmd.mem_access.addr = v->addr;
		c->dcmd.mem_access.size = v->size;
		c->dcmd.mem_access.access = v->access;
		c->dlen = sizeof(c->dcmd.mem_access);
		return 0;
	default:
		return -EINVAL;
	}

	/* RESERVE, CREATE, MAP: the record kept at completion. */
	c->res = kzalloc(sizeof(*c->res), GFP_KERNEL);
	if (!c->res)
		return -ENOMEM;
	switch (v->op) {
	case VGPU_VMM_RESERVE:
		c->res->va = true;
		c->res->size = v->size;
		break;
	case VGPU_VMM_CREATE:
		c->res->phys = true;
		c->res->size = 1;
		c->res->bytes = v->size;
		break;
	default:
		c->res->mapping = true;
		c->res->addr = v->addr;
		c->res->size = v->size;
		c->res->owner = v->handle;
		break;
	}
	return 0;
}

/*
 * Checks that the command names only what the file holds; FREE, RELEASE
 * and UNMAP forget it (into @gone). res_lock held.
 */
static int vgpu_vmm_check_locked(struct vgpu_file *vf, const struct vgpu_vmm *v,
				 struct list_head *gone)
{
	struct vgpu_res *r;
	u64 addr, end;
	int ret;

	switch (v->op) {
	case VGPU_VMM_FREE:
		r = vgpu_range_find(&vf->vas, v->addr);
		if (!r || r->addr != v->addr)
			return -ENOENT;
		if (r->size != v->size)
			return -EINVAL;
		rb_erase(&r->node, &vf->vas);
		list_add(&r->link, gone);
		return 0;
	case VGPU_VMM_RELEASE:
		r = vgpu_range_find(&vf->phys, v->handle);
		if (!r || r->addr != v->handle)
			return -ENOENT;
		rb_erase(&r->node, &vf->phys);
		vf->mem_bytes -= r->bytes;
		list_add(&r->link, gone);
		return 0;
	case VGPU_VMM_MAP:
		r = vgpu_range_find(&vf->phys, v->handle);
		if (!r || r->addr != v->handle)
			return -ENOENT;
		r = vgpu_range_find(&vf->vas, v->addr);
		if (!r || v->size > r->size - (v->addr - r->addr))
			return -EINVAL;
		return 0;
	case VGPU_VMM_UNMAP:
		ret = vgpu_whole_mappings_locked(vf, v->addr, v->size);
		if (ret)
			return ret;
		addr = v->addr;
		end = v->addr + v->size;
		while (addr < end) {
			r = vgpu_alloc_find(vf, addr);
			addr += r->size;
			rb_erase(&r->node, &vf->allocs);
			list_add(&r->link, gone);
		}
		return 0;
	case VGPU_VMM_ACCESS:
		return vgpu_whole_mappings_locked(vf, v->addr, v->size);
	default:
		return 0;
	}
}

static long vgpu_ioctl_vmm(struct vgpu_file *vf, struct vgpu_vmm __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_res *r, *tmp;
	struct vgpu_batch *b;
	struct vgpu_bcmd *c;
	unsigned long flags;
	struct vgpu_vmm v;
	LIST_HEAD(gone);
	long ret;

	if (copy_from_user(&v, arg, sizeof(v)))
		return -EFAULT;
	if (!(vdev->features & VGPU_FEATURE_VMM))
		return -EOPNOTSUPP;

	b = vgpu_single(vf);
	if (!b)
		return -ENOMEM;
	c = &b->cmds[0];
	ret = vgpu_vmm_prep(&v, c);
	if (ret)
		goto put;

	down_read(&vdev->hw_lock);
	if (vdev->dead) {
		ret = -ENODEV;
		goto unlock_hw;
	}
	ret = mutex_lock_killable(&vf->submit_lock);
	if (ret)
		goto unlock_hw;
	b->gen = READ_ONCE(vdev->gen);
	ret = vgpu_res_sync_gen(vf, b->gen);
	if (!ret) {
		spin_lock_irqsave(&vf->res_lock, flags);
		ret = vgpu_vmm_check_locked(vf, &v, &gone);
		spin_unlock_irqrestore(&vf->res_lock, flags);
	}
	if (!ret) {
		/*
		 * Commands of the file already on the ring run before this
		 * one; later ones are checked against the table without what
		 * it ends.
		 */
		ret = vgpu_queue_submit(vf->q, b, true);
		if (ret) {
			/* Not sent: what it would have ended stays the file's. */
			spin_lock_irqsave(&vf->res_lock, flags);
			list_for_each_entry_safe(r, tmp, &gone, link) {
				list_del(&r->link);
				if (r->va)
					vgpu_range_insert(&vf->vas, r);
				else if (r->phys && vgpu_range_insert(&vf->phys, r))
					vf->mem_bytes += r->bytes;
				else if (r->mapping)
					vgpu_alloc_insert(vf, r);
			}
			spin_unlock_irqrestore(&vf->res_lock, flags);
		}
	}
	mutex_unlock(&vf->submit_lock);
unlock_hw:
	up_read(&vdev->hw_lock);
	list_for_each_entry_safe(r, tmp, &gone, link)
		kfree(r);
	if (ret)
		goto put;

	/*
	 * Killed while waiting: what the command makes, if it runs, is
	 * recorded at completion and ends with the file.
	 */
	ret = vgpu_wait_internal(vf, b);
	if (ret)
		goto put;
	ret = c->error;
	if (!ret && (v.op == VGPU_VMM_RESERVE || v.op == VGPU_VMM_CREATE)) {
		if (v.op == VGPU_VMM_RESERVE)
			v.addr = c->result;
		else
			v.handle = c->result;
		if (copy_to_user(arg, &v, sizeof(v)))
			ret = -EFAULT;
	}
put:
	vgpu_batch_put(b);
	return ret;
}

static long vgpu_ioctl_submit(struct vgpu_file *vf,
			      struct vgpu_submit __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_budget bud = { .vf = vf };
	struct vgpu_submit s;
	struct vgpu_cmd *kc;
	struct vgpu_batch *b;
	struct vgpu_wait w;
	u32 i, bad = VGPU_NO_INDEX;
	long ret;

	if (copy_from_user(&s, arg, sizeof(s)))
		return -EFAULT;
	if (s.flags & ~VGPU_SUBMIT_WAIT || !s.count)
		return -EINVAL;
	if (s.count > VGPU_MAX_BATCH_CMDS)
		return -E2BIG;

	kc = memdup_array_user(u64_to_user_ptr(s.cmds), s.count, sizeof(*kc));
	if (IS_ERR(kc))
		return PTR_ERR(kc);
	b = vgpu_batch_alloc(vdev, vf, s.count);
	if (!b) {
		kfree(kc);
		return -ENOMEM;
	}

	down_read(&vdev->hw_lock);
	if (vdev->dead) {
		ret = -ENODEV;
		goto unlock_hw;
	}
	for (i = 0; i < s.count; i++) {
		ret = vgpu_prep_cmd(vdev, &b->cmds[i], &kc[i], &bud);
		if (ret) {
			bad = i;
			goto unlock_hw;
		}
		b->ndesc += b->cmds[i].ndesc;
	}
	if (b->ndesc > vf->q->size) {
		ret = -E2BIG;
		goto unlock_hw;
	}

	ret = mutex_lock_killable(&vf->submit_lock);
	if (ret)
		goto unlock_hw;
	if (atomic_read(&vf->nrecords) >= VGPU_MAX_UNCOLLECTED) {
		ret = -EBUSY;
		goto unlock;
	}
	b->gen = READ_ONCE(vdev->gen);
	ret = vgpu_res_sync_gen(vf, b->gen);
	if (ret)
		goto unlock;
	for (i = 0; i < s.count; i++) {
		ret = vgpu_check_cmd(vf, &kc[i], &b->cmds[i]);
		if (ret) {
			bad = i;
			goto undo;
		}
	}

	b->seq = vf->next_seq;
	kref_get(&b->ref);	/* the fence table's reference */
	ret = xa_insert(&vf->batches, b->seq, b, GFP_KERNEL);
	if (ret) {
		vgpu_batch_put(b);
		goto undo;
	}
	ret = vgpu_queue_submit(vf->q, b, true);
	if (ret) {
		xa_erase(&vf->batches, b->seq);
		vgpu_batch_put(b);
		goto undo;
	}
	WRITE_ONCE(vf->next_seq, b->seq + 1);
	atomic_inc(&vf->nrecords);
	vgpu_modules_settle(vf, true);
	mutex_unlock(&vf->submit_lock);
	up_read(&vdev->hw_lock);
	kfree(kc);

	s.fence = b->seq;
	s.error_index = VGPU_NO_INDEX;
	s.error = 0;
	if (!(s.flags & VGPU_SUBMIT_WAIT)) {
		ret = copy_to_user(arg, &s, sizeof(s)) ? -EFAULT : 0;
		goto put;
	}
	if (put_user(s.fence, &arg->fence)) {
		ret = -EFAULT;
		goto put;
	}
	ret = vgpu_wait_fence(vf, s.fence, s.timeout_ns);
	if (ret)
		goto put;
	ret = vgpu_collect(vf, s.fence, false, u64_to_user_ptr(s.cmds),
			   s.count, &w);
	if (ret)
		goto put;
	s.error_index = w.error_index;
	s.error = w.error;
	ret = copy_to_user(arg, &s, sizeof(s)) ? -EFAULT : 0;
put:
	vgpu_batch_put(b);
	return ret;

undo:
	vgpu_modules_settle(vf, false);
unlock:
	mutex_unlock(&vf->submit_lock);
unlock_hw:
	vgpu_batch_release_resources(b);
	up_read(&vdev->hw_lock);
	vgpu_batch_put(b);
	kfree(kc);
	if (put_user(bad, &arg->error_index))
		return -EFAULT;
	return ret;
}

static long vgpu_ioctl_wait(struct vgpu_file *vf, struct vgpu_wait __user *arg)
{
	struct vgpu_wait w;
	long ret;

	if (copy_from_user(&w, arg, sizeof(w)))
		return -EFAULT;
	if (w.flags & ~VGPU_WAIT_ALL || (!w.cmds && w.count))
		return -EINVAL;
	if (!w.fence || w.fence >= READ_ONCE(vf->next_seq))
		return -EINVAL;

	ret = vgpu_wait_fence(vf, w.fence, w.timeout_ns);
	if (ret)
		return ret;
	ret = vgpu_collect(vf, w.fence, w.flags & VGPU_WAIT_ALL,
			   u64_to_user_ptr(w.cmds), w.count, &w);
	if (ret)
		return ret;
	return copy_to_user(arg, &w, sizeof(w)) ? -EFAULT : 0;
}

static u32 vgpu_count_processes(struct vgpu_dev *vdev)
{
	struct vgpu_file *vf, *o;
	u32 n = 0;

	list_for_each_entry(vf, &vdev->files, link) {
		bool seen = false;

		list_for_each_entry(o, &vdev->files, link) {
			if (o == vf)
				break;
			if (o->tgid == vf->tgid) {
				seen = true;
				break;
			}
		}
		if (!seen)
			n++;
	}
	return n;
}

static long vgpu_ioctl_usage(struct vgpu_file *vf, void __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_usage u = {};
	unsigned long flags;

	down_read(&vdev->hw_lock);
	if (vdev->dead) {
		up_read(&vdev->hw_lock);
		return -ENODEV;
	}
	u.mem_used = readq(vdev->regs + VGPU_REG_MEM_USED);
	/* Read here too: the interrupt that tells of a resize may be late. */
	u.mem_size = readq(vdev->regs + VGPU_REG_MEM_SIZE);
	u.busy_ns = readq(vdev->regs + VGPU_REG_BUSY_NS);
	u.commands = readq(vdev->regs + VGPU_REG_COMMANDS);
	u.device_errors = readl(vdev->regs + VGPU_REG_ERROR_COUNT);
	if (vdev->contexts)
		u.contexts = readl(vdev->regs + VGPU_REG_CONTEXTS);
	up_read(&vdev->hw_lock);
	u.context = vgpu_res_file(vf)->ctx;
	/* Counted in mem_used from the context's first command on. */
	if (u.context && !READ_ONCE(vgpu_res_file(vf)->ctx_used))
		u.context_pending = vdev->context_cost;

	mutex_lock(&vdev->files_lock);
	u.open_files = vdev->nfiles;
	u.processes = vgpu_count_processes(vdev);
	mutex_unlock(&vdev->files_lock);

	spin_lock_irqsave(&vf->res_lock, flags);
	if (vf->res_gen == READ_ONCE(vdev->gen)) {
		u.file_mem_used = vf->mem_bytes;
		u.file_allocs = vf->nallocs;
		u.file_modules = vf->nmodules;
	}
	spin_unlock_irqrestore(&vf->res_lock, flags);

	spin_lock_irqsave(&vf->q->lock, flags);
	u.file_inflight = vf->inflight;
	spin_unlock_irqrestore(&vf->q->lock, flags);
	u.file_uncollected = atomic_read(&vf->nrecords);
	u.recoveries = atomic_read(&vdev->recoveries);

	return copy_to_user(arg, &u, sizeof(u)) ? -EFAULT : 0;
}

long vgpu_ioctl(struct file *filp, unsigned int cmd, unsigned long arg)
{
	struct vgpu_file *vf = filp->private_data;
	void __user *uarg = (void __user *)arg;

	switch (cmd) {
	case VGPU_IOCTL_ALLOC:
	case VGPU_IOCTL_FREE:
	case VGPU_IOCTL_PIN:
	case VGPU_IOCTL_UNPIN:
	case VGPU_IOCTL_VMM:
		/* A lane's resources are its owner's. */
		if (vf->owner)
			return -EINVAL;
		break;
	}
	switch (cmd) {
	case VGPU_IOCTL_ALLOC:
	case VGPU_IOCTL_FREE:
	case VGPU_IOCTL_SUBMIT:
	case VGPU_IOCTL_VMM:
	case VGPU_IOCTL_LANE: {
		int ret = vgpu_file_check_lost(vf);

		if (ret)
			return ret;
		break;
	}
	}
	switch (cmd) {
	case VGPU_IOCTL_INFO:
		return vgpu_ioctl_info(vf, uarg);
	case VGPU_IOCTL_ALLOC:
		return vgpu_ioctl_alloc(vf, uarg);
	case VGPU_IOCTL_FREE:
		return vgpu_ioctl_free(vf, uarg);
	case VGPU_IOCTL_SUBMIT:
		return vgpu_ioctl_submit(vf, uarg);
	case VGPU_IOCTL_WAIT:
		return vgpu_ioctl_wait(vf, uarg);
	case VGPU_IOCTL_USAGE:
		return vgpu_ioctl_usage(vf, uarg);
	case VGPU_IOCTL_PIN:
		return vgpu_ioctl_pin(vf, uarg);
	case VGPU_IOCTL_UNPIN:
		return vgpu_ioctl_unpin(vf, uarg);
	case VGPU_IOCTL_LANE:
		return vgpu_ioctl_lane(vf, uarg);
	case VGPU_IOCTL_VMM:
		return vgpu_ioctl_vmm(vf, uarg);
	}
	/* One of ours with the wrong size or direction. */
	if (_IOC_TYPE(cmd) == VGPU_IOCTL_MAGIC &&
	    _IOC_NR(cmd) >= _IOC_NR(VGPU_IOCTL_INFO) &&
	    _IOC_NR(cmd) <= _IOC_NR(VGPU_IOCTL_VMM))
		return -EINVAL;
	return -ENOTTY;
}

/* ---- close ------------------------------------------------------------------- */

/* What a closed file held, to end on the device. */
struct vgpu_held {
	struct rb_root allocs;		/* allocations, globals, mappings */
	struct rb_root vas;
	struct rb_root phys;
	struct list_head modules;
};

/* The device command that ends @r, in @d; false for none (a global). */
static bool vgpu_end_cmd(const struct vgpu_res *r, union vgpu_dcmd *d)
{
	memset(d, 0, sizeof(*d));
	if (r->module) {
		d->module_unload.hdr.opcode = VGPU_OP_MODULE_UNLOAD;
		d->module_unload.module = r->addr;
	} else if (r->va) {
		d->va.hdr.opcode = VGPU_OP_VA_RESERVE;
		d->va.hdr.flags = VGPU_VA_FLAG_FREE;
		d->va.addr = r->addr;
		d->va.size = r->size;
	} else if (r->phys) {
		d->mem_create.hdr.opcode = VGPU_OP_MEM_CREATE;
		d->mem_create.hdr.flags = VGPU_MEM_CREATE_FLAG_RELEASE;
		d->mem_create.handle = r->addr;
	} else if (r->mapping) {
		d->mem_map.hdr.opcode = VGPU_OP_MEM_MAP;
		d->mem_map.hdr.flags = VGPU_MEM_MAP_FLAG_UNMAP;
		d->mem_map.addr = r->addr;
		d->mem_map.size = r->size;
	} else if (!r->global) {
		d->mem_free.hdr.opcode = VGPU_OP_MEM_FREE;
		d->mem_free.addr = r->addr;
	} else {
		/* A global goes with its module's unload. */
		return false;
	}
	return true;
}

static u32 vgpu_dcmd_len(const union vgpu_dcmd *d)
{
	switch (d->hdr.opcode) {
	case VGPU_OP_MODULE_UNLOAD:
		return sizeof(d->module_unload);
	case VGPU_OP_VA_RESERVE:
		return sizeof(d->va);
	case VGPU_OP_MEM_CREATE:
		return sizeof(d->mem_create);
	case VGPU_OP_MEM_MAP:
		return sizeof(d->mem_map);
	default:
		return sizeof(d->mem_free);
	}
}

/*
 * Appends the commands that end what @root holds: mappings first (with
 * @mappings), else everything else of it. Returns the new count.
 */
static u32 vgpu_end_tree(struct rb_root *root, bool mappings,
			 union vgpu_dcmd *cmds, u32 n, u32 max)
{
	struct rb_node *node;

	for (node = rb_first(root); node && n < max; node = rb_next(node)) {
		struct vgpu_res *r = rb_entry(node, struct vgpu_res, node);

		if (r->mapping == mappings && vgpu_end_cmd(r, &cmds[n]))
			n++;
	}
	return n;
}

/*
 * Queues what ends everything a closed file held, in an order the
 * device accepts: UNMAP of its mappings, MEM_FREE of its allocations,
 * RELEASE of its physical allocations, FREE of its reservations, then
 * MODULE_UNLOAD. Returns the last batch queued (referenced), whose
 * completion implies the others'.
 */
static struct vgpu_batch *vgpu_free_res_on_device(struct vgpu_file *vf,
						  struct vgpu_held *h, u64 gen)
{
	struct vgpu_batch *last = NULL;
	struct vgpu_dev *vdev = vf->vdev;
	u32 per = min_t(u32, VGPU_MAX_BATCH_CMDS, vf->q->size / 2);
	union vgpu_dcmd *cmds;
	struct rb_node *node;
	struct vgpu_res *m;
	u32 max = 0, n = 0, done = 0;

	for (node = rb_first(&h->allocs); node; node = rb_next(node))
		max++;
	for (node = rb_first(&h->vas); node; node = rb_next(node))
		max++;
	for (node = rb_first(&h->phys); node; node = rb_next(node))
		max++;
	list_for_each_entry(m, &h->modules, link)
		max++;
	if (!max)
		return NULL;
	cmds = kvmalloc_array(max, sizeof(*cmds), GFP_KERNEL);
	if (!cmds) {
		dev_warn_ratelimited(&vdev->pdev->dev,
				     "no memory to free what a closed file held\n");
		return NULL;
	}
	n = vgpu_end_tree(&h->allocs, true, cmds, n, max);
	n = vgpu_end_tree(&h->allocs, false, cmds, n, max);
	n = vgpu_end_tree(&h->phys, false, cmds, n, max);
	n = vgpu_end_tree(&h->vas, false, cmds, n, max);
	list_for_each_entry(m, &h->modules, link)
		if (n < max && vgpu_end_cmd(m, &cmds[n]))
			n++;

	while (done < n) {
		u32 k = min(per, n - done), i;
		struct vgpu_batch *b = vgpu_batch_alloc(vdev, NULL, k);

		if (!b)
			break;
		for (i = 0; i < k; i++) {
			struct vgpu_bcmd *c = &b->cmds[i];

			c->dcmd = cmds[done + i];
			c->dlen = vgpu_dcmd_len(&c->dcmd);
			c->npieces = 1;
			c->ndesc = 2;
		}
		b->ndesc = 2 * k;
		b->gen = gen;
		if (vgpu_queue_submit(vf->q, b, false)) {
			vgpu_batch_put(b);
			break;
		}
		if (last)
			vgpu_batch_put(last);
		last = b;
		done += k;
	}
	kvfree(cmds);
	return last;
}

/*
 * Queues CTX_DESTROY for the context of @cf, the last of whose files
 * (@vf: @cf itself or one of its lanes) is being cleaned up: the device
 * frees everything the context holds at once, whether it is alive or
 * ended by a fault. The batch keeps @cf, and so its id, until it
 * completed. Returns the batch (referenced), or NULL.
 */
static struct vgpu_batch *vgpu_ctx_destroy(struct vgpu_file *vf,
					   struct vgpu_file *cf)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_batch *b = vgpu_batch_alloc(vdev, NULL, 1);
	struct vgpu_bcmd *c;

	if (!b) {
		dev_warn_ratelimited(&vdev->pdev->dev,
				     "context %u: no memory to destroy it\n",
				     cf->ctx);
		return NULL;
	}
	c = &b->cmds[0];
	c->dcmd.hdr.opcode = VGPU_OP_CTX_DESTROY;
	c->dlen = sizeof(c->dcmd.hdr);
	c->npieces = 1;
	c->ndesc = 2;
	b->ndesc = 2;
	b->ctx = cf->ctx;
	/* A reset since ends every context: then nothing is queued. */
	b->gen = READ_ONCE(vdev->gen);
	kref_get(&cf->ref);
	b->ctx_hold = cf;
	if (vgpu_queue_submit(vf->q, b, false)) {
		vgpu_batch_put(b);
		return NULL;
	}
	return b;
}

/*
 * Runs once a closed file has nothing on the ring: frees its device
 * memory, virtual memory and modules (unless a function reset already
 * did) and drops the
 * reference of the open file. With contexts, the last of a context's
 * files (its owner and lanes) destroys the context instead, which frees
 * all of it at once; memory of a context a fault ended is gone already,
 * and single frees would only be answered CONTEXT_LOST. With wait, gives
 * the device a moment to finish, so that a process reopening the
 * function finds its memory back.
 */
void vgpu_file_cleanup(struct vgpu_file *vf, bool wait)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_file *cf = vgpu_res_file(vf);
	struct vgpu_batch *last = NULL;
	struct vgpu_res *r, *tmp;
	struct vgpu_held h;
	unsigned long flags;
	u64 gen;

	INIT_LIST_HEAD(&h.modules);
	spin_lock_irqsave(&vf->res_lock, flags);
	h.allocs = vf->allocs;
	vf->allocs = RB_ROOT;
	h.vas = vf->vas;
	vf->vas = RB_ROOT;
	h.phys = vf->phys;
	vf->phys = RB_ROOT;
	list_splice_init(&vf->modules, &h.modules);
	vf->mem_bytes = 0;
	vf->nallocs = 0;
	vf->nmodules = 0;
	gen = vf->res_gen;
	spin_unlock_irqrestore(&vf->res_lock, flags);

	down_read(&vdev->hw_lock);
	if (cf->ctx) {
		if (atomic_dec_and_test(&cf->ctx_users) && !vdev->dead &&
		    READ_ONCE(cf->ctx_used))
			last = vgpu_ctx_destroy(vf, cf);
	} else if (!vdev->dead && gen == READ_ONCE(vdev->gen)) {
		last = vgpu_free_res_on_device(vf, &h, gen);
	}
	up_read(&vdev->hw_lock);
	if (last) {
		/* Reaping a queue wakes space_wq. */
		if (wait)
			wait_event_timeout(vf->q->space_wq,
					   vgpu_batch_done(last),
					   VGPU_CLOSE_WAIT);
		vgpu_batch_put(last);
	}

	rbtree_postorder_for_each_entry_safe(r, tmp, &h.allocs, node)
		kfree(r);
	rbtree_postorder_for_each_entry_safe(r, tmp, &h.vas, node)
		kfree(r);
	rbtree_postorder_for_each_entry_safe(r, tmp, &h.phys, node)
		kfree(r);
	list_for_each_entry_safe(r, tmp, &h.modules, link)
		kfree(r);

	vgpu_file_put(vf);
}

void vgpu_file_cleanup_work(struct work_struct *work)
{
	vgpu_file_cleanup(container_of(work, struct vgpu_file, cleanup_work),
			  false);
}

void vgpu_res_drop_all(struct vgpu_file *vf)
{
	unsigned long flags;

	spin_lock_irqsave(&vf->res_lock, flags);
	vgpu_res_drop_all_locked(vf);
	spin_unlock_irqrestore(&vf->res_lock, flags);
}
