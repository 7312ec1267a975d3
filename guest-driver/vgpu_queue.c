// SPDX-License-Identifier: GPL-2.0
/*
 * vgpu command queues: virtio split rings with event index in coherent DMA
 * memory, the doorbell page protocol, completion reaping, and recovery of
 * a queue the device put into the error state.
 */

#include <linux/dma-mapping.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/mm.h>
#include <linux/slab.h>

#include "vgpu_drv.h"

static_assert(sizeof(union vgpu_dcmd) <= VGPU_SLOT_CMD_BYTES);
static_assert(VGPU_INLINE_SG >= 1);

static bool vgpu_need_event(u16 event, u16 new_idx, u16 old_idx)
{
	return (u16)(new_idx - event - 1) < (u16)(new_idx - old_idx);
}

static void __iomem *vgpu_qreg(struct vgpu_queue *q, u32 reg)
{
	return q->vdev->regs + VGPU_QUEUE_REGS_OFFSET +
	       q->index * VGPU_QUEUE_REGS_STRIDE + reg;
}

static void __iomem *vgpu_dbslot(struct vgpu_queue *q, u32 off)
{
	return q->vdev->db + q->index * VGPU_DOORBELL_STRIDE + off;
}

/* Back to an empty ring. The device must not be using it. */
static void vgpu_queue_reset_ring(struct vgpu_queue *q)
{
	unsigned int i;

	memset(q->ring, 0, q->ring_bytes);
	memset(q->slots, 0, q->size * sizeof(*q->slots));
	for (i = 0; i < q->size; i++)
		q->next[i] = i + 1;
	q->free_head = 0;
	q->num_free = q->size;
	q->avail_idx = 0;
	q->last_used = 0;
	q->kick_idx = 0;
	q->corrupt = false;
}

static void vgpu_queue_done_work(struct work_struct *work);

int vgpu_queue_init(struct vgpu_dev *vdev, struct vgpu_queue *q,
		    unsigned int index, unsigned int size)
{
	struct device *dev = &vdev->pdev->dev;
	size_t avail_off, used_off;

	q->vdev = vdev;
	q->index = index;
	q->size = size;
	spin_lock_init(&q->lock);
	init_waitqueue_head(&q->space_wq);
	INIT_LIST_HEAD(&q->done_list);
	INIT_WORK(&q->done_work, vgpu_queue_done_work);

	/* Descriptors, then the available ring, then the used ring. */
	avail_off = size * sizeof(struct vgpu_vring_desc);
	used_off = ALIGN(avail_off + 4 + 2 * size + 2, 64);
	q->ring_bytes = used_off + 4 + 8 * size + 2;
	q->ring = dma_alloc_coherent(dev, q->ring_bytes, &q->ring_dma,
				     GFP_KERNEL);
	if (!q->ring)
		goto nomem;
	q->desc = q->ring;
	q->avail = q->ring + avail_off;
	q->used = q->ring + used_off;
	q->avail_dma = q->ring_dma + avail_off;
	q->used_dma = q->ring_dma + used_off;
	q->used_event = &q->avail->ring[size];
	q->avail_event = (__le16 *)&q->used->ring[size];

	/* Command slots, then completions, then the fence word. */
	q->cbuf_bytes = size * (VGPU_SLOT_SIZE + sizeof(struct vgpu_completion)) +
			sizeof(u64);
	q->cbuf = dma_alloc_coherent(dev, q->cbuf_bytes, &q->cbuf_dma,
				     GFP_KERNEL);
	if (!q->cbuf)
		goto nomem;
	q->compl = q->cbuf + size * VGPU_SLOT_SIZE;
	q->compl_dma = q->cbuf_dma + size * VGPU_SLOT_SIZE;
	q->fence_dma = q->compl_dma + size * sizeof(struct vgpu_completion);

	q->slots = kcalloc(size, sizeof(*q->slots), GFP_KERNEL);
	q->next = kcalloc(size, sizeof(*q->next), GFP_KERNEL);
	q->heads = kcalloc(size, sizeof(*q->heads), GFP_KERNEL);
	if (!q->slots || !q->next || !q->heads)
		goto nomem;

	vgpu_queue_reset_ring(q);
	return 0;

nomem:
	vgpu_queue_free_mem(q);
	return -ENOMEM;
}

/* Frees the ring memory; the device no longer uses it. */
void vgpu_queue_free_mem(struct vgpu_queue *q)
{
	struct device *dev;
	unsigned long flags;

	if (!q->vdev)
		return;
	dev = &q->vdev->pdev->dev;

	spin_lock_irqsave(&q->lock, flags);
	q->dead = true;
	spin_unlock_irqrestore(&q->lock, flags);

	if (q->ring)
		dma_free_coherent(dev, q->ring_bytes, q->ring, q->ring_dma);
	if (q->cbuf)
		dma_free_coherent(dev, q->cbuf_bytes, q->cbuf, q->cbuf_dma);
	q->ring = NULL;
	q->cbuf = NULL;
	kfree(q->slots);
	kfree(q->next);
	kfree(q->heads);
	q->slots = NULL;
	q->next = NULL;
	q->heads = NULL;
}

/* Programs the ring into the device and enables the queue. */
int vgpu_queue_hw_enable(struct vgpu_queue *q)
{
	u32 ctrl = VGPU_QCONTROL_ENABLE;
	u32 st;

	if (q->polled)
		ctrl |= VGPU_QCONTROL_POLLED;

	writel(0, vgpu_qreg(q, VGPU_QREG_CONTROL));
	writel(q->size, vgpu_qreg(q, VGPU_QREG_SIZE));
	lo_hi_writeq(q->ring_dma, vgpu_qreg(q, VGPU_QREG_DESC));
	lo_hi_writeq(q->avail_dma, vgpu_qreg(q, VGPU_QREG_AVAIL));
	lo_hi_writeq(q->used_dma, vgpu_qreg(q, VGPU_QREG_USED));
	writel(q->vector, vgpu_qreg(q, VGPU_QREG_MSIX_VECTOR));
	writel(0, vgpu_dbslot(q, VGPU_DB_AVAIL_IDX));
	writel(ctrl, vgpu_qreg(q, VGPU_QREG_CONTROL));

	st = readl(vgpu_qreg(q, VGPU_QREG_STATUS));
	if (!(st & VGPU_QSTATUS_ENABLED) || (st & VGPU_QSTATUS_ERROR)) {
		dev_err(&q->vdev->pdev->dev,
			"queue %u: enabling failed (status %#x, error %u)\n",
			q->index, st, readl(vgpu_qreg(q, VGPU_QREG_ERROR)));
		return -EIO;
	}
	return 0;
}

u32 vgpu_queue_hw_status(struct vgpu_queue *q, u32 *error)
{
	u32 st = readl(vgpu_qreg(q, VGPU_QREG_STATUS));

	*error = st & VGPU_QSTATUS_ERROR ? readl(vgpu_qreg(q, VGPU_QREG_ERROR)) : 0;
	return st;
}

/*
 * Disables the queue. Register accesses are trapped and handled in order,
 * so once the status read returns the device has finished with the ring.
 */
void vgpu_queue_hw_disable(struct vgpu_queue *q)
{
	writel(0, vgpu_qreg(q, VGPU_QREG_CONTROL));
	readl(vgpu_qreg(q, VGPU_QREG_STATUS));
}

/* ---- batches ------------------------------------------------------------ */

struct vgpu_batch *vgpu_batch_alloc(struct vgpu_dev *vdev,
				    struct vgpu_file *vf, u32 ncmds)
{
	struct vgpu_batch *b;

	b = kvzalloc(struct_size(b, cmds, ncmds), GFP_KERNEL);
	if (!b)
		return NULL;
	kref_init(&b->ref);
	b->ncmds = ncmds;
	b->vdev = vdev;
	kref_get(&vdev->ref);
	if (vf) {
		b->vf = vf;
		kref_get(&vf->ref);
	}
	INIT_LIST_HEAD(&b->done_link);
	return b;
}

/* Unpins, unmaps and frees what the commands used. Process context. */
void vgpu_batch_release_resources(struct vgpu_batch *b)
{
	struct device *dev = &b->vdev->pdev->dev;
	u32 i, j;

	for (i = 0; i < b->ncmds; i++) {
		struct vgpu_bcmd *c = &b->cmds[i];

		if (c->mapped) {
			dma_unmap_sgtable(dev, &c->sgt, c->dir, 0);
			c->mapped = false;
		}
		if (c->sgt.sgl) {
			sg_free_table(&c->sgt);
			memset(&c->sgt, 0, sizeof(c->sgt));
		}
		if (c->pages) {
			unpin_user_pages_dirty_lock(c->pages, c->npages,
						    c->dirty);
			kvfree(c->pages);
			c->pages = NULL;
		}
		if (c->pinned) {
			if (c->dirty && c->pinned->need_sync)
				dma_sync_sgtable_for_cpu(dev, &c->pinned->sgt,
							 DMA_BIDIRECTIONAL);
			vgpu_pinned_put(c->pinned);
			c->pinned = NULL;
		}
		for (j = 0; j < c->nbufs; j++)
			dma_free_coherent(dev, c->bufs[j].size, c->bufs[j].cpu,
					  c->bufs[j].dma);
		kfree(c->bufs);
		c->bufs = NULL;
		c->nbufs = 0;
		kfree(c->piece_len);
		c->piece_len = NULL;
		kfree(c->res);
		c->res = NULL;
	}
}

static void vgpu_batch_free(struct kref *ref)
{
	struct vgpu_batch *b = container_of(ref, struct vgpu_batch, ref);

	vgpu_batch_release_resources(b);
	if (b->vf)
		vgpu_file_put(b->vf);
	if (b->ctx_hold)
		vgpu_file_put(b->ctx_hold);
	vgpu_dev_put(b->vdev);
	kvfree(b);
}

void vgpu_batch_put(struct vgpu_batch *b)
{
	kref_put(&b->ref, vgpu_batch_free);
}

/* Completed batches: release their DMA resources in process context. */
static void vgpu_queue_done_work(struct work_struct *work)
{
	struct vgpu_queue *q = container_of(work, struct vgpu_queue, done_work);
	struct vgpu_batch *b, *tmp;
	LIST_HEAD(list);

	spin_lock_irq(&q->lock);
	list_splice_init(&q->done_list, &list);
	spin_unlock_irq(&q->lock);

	list_for_each_entry_safe(b, tmp, &list, done_link) {
		list_del_init(&b->done_link);
		vgpu_batch_release_resources(b);
		vgpu_batch_put(b);	/* the ring's reference */
	}
}

/* ---- submission --------------------------------------------------------- */

/* One device command: its structure, data and completion descriptors. */
struct vgpu_piece {
	const union vgpu_dcmd *dcmd;
	u32 dlen;
	const void *inl;		/* copied into the slot's data area */
	u32 inl_len;
	dma_addr_t data_dma;		/* one external data range */
	u32 data_len;
	const struct vgpu_dmabuf *bufs;	/* more external ranges */
	u32 nbufs;
};

static void vgpu_desc_put(struct vgpu_queue *q, u16 *cur, u16 *last,
			  u64 addr, u32 len, u16 flags)
{
	struct vgpu_vring_desc *d = &q->desc[*cur];

	d->addr = cpu_to_le64(addr);
	d->len = cpu_to_le32(len);
	d->flags = cpu_to_le16(flags | VGPU_VRING_F_NEXT);
	d->next = cpu_to_le16(q->next[*cur]);
	*last = *cur;
	*cur = q->next[*cur];
}

/*
 * Writes one chain and puts its head into the available ring (the index
 * is published by the caller). The caller checked there is room.
 */
static void vgpu_queue_add_chain(struct vgpu_queue *q, struct vgpu_batch *b,
				 u32 ci, const struct vgpu_piece *p)
{
	u16 head = q->free_head, cur = head, last = head;
	void *slot = q->cbuf + head * VGPU_SLOT_SIZE;
	struct vgpu_cmd_hdr *hdr = slot;
	dma_addr_t slot_dma = q->cbuf_dma + head * VGPU_SLOT_SIZE;
	unsigned int pos = q->avail_idx & (q->size - 1);
	u16 n = 0;
	u32 i;

	memcpy(slot, p->dcmd, p->dlen);
	/*
	 * The context is the driver's to name: the opcode's own flags are
	 * bits 0-15, which is all a command's checks let through.
	 */
	hdr->flags = lower_16_bits(hdr->flags) |
		     (u32)b->ctx << VGPU_CMD_CTX_SHIFT;
	vgpu_desc_put(q, &cur, &last, slot_dma, p->dlen, 0);
	n++;
	if (p->inl_len) {
		memcpy(slot + VGPU_SLOT_DATA_OFF, p->inl, p->inl_len);
		vgpu_desc_put(q, &cur, &last, slot_dma + VGPU_SLOT_DATA_OFF,
			      p->inl_len, 0);
		n++;
	}
	if (p->data_len) {
		vgpu_desc_put(q, &cur, &last, p->data_dma, p->data_len, 0);
		n++;
	}
	for (i = 0; i < p->nbufs; i++) {
		vgpu_desc_put(q, &cur, &last, p->bufs[i].dma, p->bufs[i].len,
			      0);
		n++;
	}
	memset(&q->compl[head], 0, sizeof(q->compl[head]));
	vgpu_desc_put(q, &cur, &last,
		      q->compl_dma + head * sizeof(struct vgpu_completion),
		      sizeof(struct vgpu_completion), VGPU_VRING_F_WRITE);
	n++;
	q->desc[last].flags = cpu_to_le16(VGPU_VRING_F_WRITE);
	q->desc[last].next = 0;

	q->free_head = cur;
	q->num_free -= n;
	q->slots[head].batch = b;
	q->slots[head].cmd = ci;
	q->slots[head].last = last;
	q->slots[head].ndesc = n;
	q->heads[pos] = head;
	q->avail->ring[pos] = cpu_to_le16(head);
	q->avail_idx++;
	b->pending++;
}

static void vgpu_queue_add_cmd(struct vgpu_queue *q, struct vgpu_batch *b,
			       u32 ci)
{
	struct vgpu_bcmd *c = &b->cmds[ci];
	struct vgpu_piece p = {
		.dcmd = &c->dcmd,
		.dlen = c->dlen,
		.inl = c->inl,
		.inl_len = c->inl_len,
		.bufs = c->bufs,
		.nbufs = c->nbufs,
	};
	union vgpu_dcmd d;
	u64 off = 0;
	u32 i;

	if (c->dcmd.hdr.opcode == VGPU_OP_FENCE) {
		/* Driver-owned fence word; the value is the batch's fence. */
		d = c->dcmd;
		d.fence.addr = q->fence_dma;
		d.fence.value = b->seq;
		p.dcmd = &d;
		vgpu_queue_add_chain(q, b, ci, &p);
		return;
	}

	if (c->dcmd.hdr.opcode != VGPU_OP_COPY || !c->nents ||
	    c->nents <= VGPU_INLINE_SG) {
		vgpu_queue_add_chain(q, b, ci, &p);
		return;
	}

	/*
	 * A long scatter-gather list lives in bufs[0]; every piece takes up
	 * to VGPU_MAX_SG_ENTRIES of it and the matching device range.
	 */
	p.bufs = NULL;
	p.nbufs = 0;
	for (i = 0; i < c->npieces; i++) {
		u32 first = i * VGPU_MAX_SG_ENTRIES;
		u32 cnt = min_t(u32, c->nents - first, VGPU_MAX_SG_ENTRIES);
		u64 len = c->npieces > 1 ? c->piece_len[i] : c->size;

		d = c->dcmd;
		if (d.copy.src_kind == VGPU_COPY_GUEST)
			d.copy.dst += off;
		else
			d.copy.src += off;
		d.copy.size = len;
		d.copy.sg_count = cnt;
		p.dcmd = &d;
		p.data_dma = c->bufs[0].dma + first * sizeof(struct vgpu_sg_entry);
		p.data_len = cnt * sizeof(struct vgpu_sg_entry);
		vgpu_queue_add_chain(q, b, ci, &p);
		off += len;
	}
}

/*
 * Publishes the new available index in the doorbell slot and decides
 * whether the device's poller must be woken: only when it does not poll
 * (POLLING reads 0) and its avail_event asks for a notification.
 */
static bool vgpu_queue_kick_prepare(struct vgpu_queue *q)
{
	u16 new_idx = q->avail_idx, old_idx = q->kick_idx;
	u16 event;

	q->kick_idx = new_idx;
	writel(new_idx, vgpu_dbslot(q, VGPU_DB_AVAIL_IDX));
	/* The index stores before the POLLING and avail_event loads. */
	mb();
	if (q->polled && readl(vgpu_dbslot(q, VGPU_DB_POLLING)))
		return false;
	event = le16_to_cpu(READ_ONCE(*q->avail_event));
	return vgpu_need_event(event, new_idx, old_idx);
}

static bool vgpu_queue_can_submit(struct vgpu_queue *q, u32 ndesc)
{
	return READ_ONCE(q->stopped) || READ_ONCE(q->failed) ||
	       (!READ_ONCE(q->broken) && READ_ONCE(q->num_free) >= ndesc);
}

/*
 * Whether a command of @b needs device state, which makes the context
 * on the device: all but those touching guest memory only (as the
 * device counts them). An unknown opcode counts, so that the context is
 * destroyed at the end whatever the device made of it.
 */
static bool vgpu_batch_makes_context(const struct vgpu_batch *b)
{
	u32 i;

	for (i = 0; i < b->ncmds; i++) {
		switch (b->cmds[i].dcmd.hdr.opcode) {
		case VGPU_OP_FENCE:
		case VGPU_OP_WRITE_VALUE:
		case VGPU_OP_WAIT_VALUE:
		case VGPU_OP_CTX_DESTROY:
			break;
		default:
			return true;
		}
	}
	return false;
}

/*
 * Puts every command of the batch on the ring, in order, waiting for room
 * if needed. The caller holds vgpu_dev.hw_lock for reading.
 */
int vgpu_queue_submit(struct vgpu_queue *q, struct vgpu_batch *b,
		      bool interruptible)
{
	unsigned long flags;
	bool kick;
	int ret;
	u32 i;

	if (b->ndesc > q->size)
		return -E2BIG;

	spin_lock_irqsave(&q->lock, flags);
	while (!q->stopped && !q->failed &&
	       (q->broken || q->num_free < b->ndesc)) {
		spin_unlock_irqrestore(&q->lock, flags);
		if (interruptible) {
			ret = wait_event_interruptible(q->space_wq,
						       vgpu_queue_can_submit(q, b->ndesc));
			if (ret)
				return ret;
		} else {
			wait_event(q->space_wq,
				   vgpu_queue_can_submit(q, b->ndesc));
		}
		spin_lock_irqsave(&q->lock, flags);
	}
	if (q->stopped)
		ret = -ENODEV;
	else if (q->failed || b->gen != READ_ONCE(q->vdev->gen))
		ret = -EIO;
	else
		ret = 0;
	if (ret) {
		spin_unlock_irqrestore(&q->lock, flags);
		return ret;
	}

	kref_get(&b->ref);	/* the ring's reference */
	if (b->vf) {
		/* The file's context, or its owner's for a lane. */
		struct vgpu_file *cf = vgpu_res_file(b->vf);

		b->ctx = cf->ctx;
		/* Looked at until the first batch that makes it. */
		if (b->ctx && !READ_ONCE(cf->ctx_used) &&
		    vgpu_batch_makes_context(b))
			WRITE_ONCE(cf->ctx_used, true);
		b->vf->queued = true;
	}
	for (i = 0; i < b->ncmds; i++)
		vgpu_queue_add_cmd(q, b, i);
	/* Chains and ring entries before the index. */
	virt_wmb();
	WRITE_ONCE(q->avail->idx, cpu_to_le16(q->avail_idx));
	if (b->vf)
		b->vf->inflight++;
	kick = vgpu_queue_kick_prepare(q);
	spin_unlock_irqrestore(&q->lock, flags);

	if (kick)
		writel(1, q->vdev->regs + VGPU_REG_WAKE);
	return 0;
}

/* ---- completion --------------------------------------------------------- */

static void vgpu_batch_complete(struct vgpu_queue *q, struct vgpu_batch *b)
{
	struct vgpu_file *vf = b->vf;
	u32 i;

	for (i = 0; i < b->ncmds; i++) {
		struct vgpu_bcmd *c = &b->cmds[i];

		if (!c->error)
			c->error = vgpu_status_errno(c->status);
	}
	/* The results above before done: pairs with vgpu_batch_done(). */
	smp_store_release(&b->done, true);
	if (vf) {
		/* A file's batches complete in order: they share one ring. */
		if (b->seq > vf->done_seq) {
			/* The results before the fence: see vgpu_fence_done(). */
			smp_store_release(&vf->done_seq, b->seq);
		}
		vf->inflight--;
		if (vf->closing && !vf->inflight)
			queue_work(vgpu_wq, &vf->cleanup_work);
		wake_up_all(&vf->wq);
	}
	list_add_tail(&b->done_link, &q->done_list);
	queue_work(vgpu_wq, &q->done_work);
}

/* Accounts one finished chain; err != 0 when the driver fails it. */
static void vgpu_complete_slot(struct vgpu_queue *q, u16 id, u32 status,
			       u64 result, u64 result2, u64 ns, int err)
{
	struct vgpu_slot *s = &q->slots[id];
	struct vgpu_batch *b = s->batch;
	struct vgpu_bcmd *c = &b->cmds[s->cmd];

	c->device_ns += ns;
	if (c->status == VGPU_STATUS_OK && !c->error) {
		if (err) {
			c->status = VGPU_STATUS_CANCELLED;
			c->error = err;
		} else {
			c->status = status;
		}
	}
	if (!err && c->npieces == 1) {
		c->result = result;
		c->result2 = result2;
	}
	if (c->res && !err && status == VGPU_STATUS_OK && b->vf) {
		if (c->res->global)
			c->res->size = result2;
		vgpu_res_record(b->vf, c->res, b->gen, result);
		c->res = NULL;
	}

	q->next[s->last] = q->free_head;
	q->free_head = id;
	q->num_free += s->ndesc;
	s->batch = NULL;
	if (--b->pending == 0)
		vgpu_batch_complete(q, b);
}

static void vgpu_queue_mark_corrupt(struct vgpu_queue *q, const char *why,
				    u32 a, u32 b)
{
	dev_err_ratelimited(&q->vdev->pdev->dev,
			    "queue %u: used ring is inconsistent (%s: %u, %u); resetting it\n",
			    q->index, why, a, b);
	q->corrupt = true;
	q->broken = true;
	vgpu_schedule_recovery(q->vdev);
}

/* Takes every completion the device has posted. Queue lock held. */
static bool vgpu_queue_reap_locked(struct vgpu_queue *q)
{
	bool progress = false;

	if (q->dead || q->corrupt)
		return false;

	for (;;) {
		u16 used_idx = le16_to_cpu(READ_ONCE(q->used->idx));

		if (used_idx == q->last_used) {
			/* Ask for an interrupt at the next completion... */
			WRITE_ONCE(*q->used_event, cpu_to_le16(q->last_used));
			/*
			 * ...and look once more for one that raced with it: the
			 * event index is written before the used index is read
			 * again, or a completion posted in between is missed.
			 */
			virt_mb();
			if (le16_to_cpu(READ_ONCE(q->used->idx)) == q->last_used)
				break;
			continue;
		}
		if ((u16)(used_idx - q->last_used) >
		    (u16)(q->avail_idx - q->last_used)) {
			vgpu_queue_mark_corrupt(q, "used index beyond available",
						used_idx, q->avail_idx);
			break;
		}
		/* Entries after the index. */
		virt_rmb();
		while (q->last_used != used_idx) {
			unsigned int pos = q->last_used & (q->size - 1);
			struct vgpu_vring_used_elem *e = &q->used->ring[pos];
			u32 id = le32_to_cpu(READ_ONCE(e->id));
			u32 len = le32_to_cpu(READ_ONCE(e->len));
			u32 status = VGPU_STATUS_DEVICE_ERROR;
			u64 result = 0, result2 = 0, ns = 0;

			/* Commands of a queue complete in order. */
			if (id != q->heads[pos] || !q->slots[id].batch) {
				vgpu_queue_mark_corrupt(q, "unexpected id", id,
							q->heads[pos]);
				goto out;
			}
			if (len >= sizeof(struct vgpu_completion)) {
				struct vgpu_completion *cp = &q->compl[id];

				status = READ_ONCE(cp->status);
				result = READ_ONCE(cp->result);
				result2 = READ_ONCE(cp->result2);
				ns = READ_ONCE(cp->device_ns);
			}
			q->last_used++;
			vgpu_complete_slot(q, id, status, result, result2, ns, 0);
			progress = true;
		}
	}
out:
	if (progress)
		wake_up_all(&q->space_wq);
	return progress;
}

void vgpu_queue_reap(struct vgpu_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	vgpu_queue_reap_locked(q);
	spin_unlock_irqrestore(&q->lock, flags);
}

/* Whether commands are on the ring. */
bool vgpu_queue_busy(struct vgpu_queue *q)
{
	return READ_ONCE(q->avail_idx) != READ_ONCE(q->last_used);
}

bool vgpu_queue_needs_reset(struct vgpu_queue *q)
{
	return READ_ONCE(q->corrupt);
}

/* ---- recovery ----------------------------------------------------------- */

/* Stops new submissions until vgpu_queue_resume(). */
void vgpu_queue_set_broken(struct vgpu_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	q->broken = true;
	spin_unlock_irqrestore(&q->lock, flags);
}

/*
 * The device no longer uses the ring (queue disabled, function reset or
 * gone): take the completions it posted, fail the rest with err, and
 * start over with an empty ring.
 */
void vgpu_queue_fail_and_reset(struct vgpu_queue *q, int err)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	vgpu_queue_reap_locked(q);
	while (q->last_used != q->avail_idx) {
		u16 id = q->heads[q->last_used & (q->size - 1)];

		q->last_used++;
		if (q->slots[id].batch)
			vgpu_complete_slot(q, id, VGPU_STATUS_CANCELLED, 0, 0, 0,
					   err);
	}
	if (!q->dead)
		vgpu_queue_reset_ring(q);
	spin_unlock_irqrestore(&q->lock, flags);
	wake_up_all(&q->space_wq);
}

void vgpu_queue_resume(struct vgpu_queue *q, bool failed)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	q->broken = false;
	q->failed = failed;
	spin_unlock_irqrestore(&q->lock, flags);
	wake_up_all(&q->space_wq);
}

/* The function is going away: fail new submissions and wake waiters. */
void vgpu_queue_stop(struct vgpu_queue *q)
{
	unsigned long flags;

	spin_lock_irqsave(&q->lock, flags);
	q->stopped = true;
	spin_unlock_irqrestore(&q->lock, flags);
	wake_up_all(&q->space_wq);
}

/*
 * A queue in the error state (or with a ring the driver found corrupt):
 * disable it, fail its pending work with -EIO and enable it again. The
 * caller holds vgpu_dev.hw_lock for reading.
 */
void vgpu_queue_recover(struct vgpu_queue *q)
{
	int ret;

	vgpu_queue_set_broken(q);
	vgpu_queue_hw_disable(q);
	vgpu_queue_fail_and_reset(q, -EIO);
	ret = vgpu_queue_hw_enable(q);
	vgpu_queue_resume(q, ret != 0);
	atomic_inc(&q->vdev->recoveries);
	if (ret)
		dev_err(&q->vdev->pdev->dev,
			"queue %u: could not be re-enabled; it fails all work\n",
			q->index);
	else
		dev_warn(&q->vdev->pdev->dev,
			 "queue %u: reset; its pending commands failed with -EIO\n",
			 q->index);
}
