// SPDX-License-Identifier: GPL-2.0
/*
 * vgpu: PCI driver for the virtual GPU functions of vgpud.
 *
 * Binds the function, checks its ABI, sets up MSI-X (or INTx), the
 * command queues and a character device /dev/vgpu<N>; handles device
 * errors by resetting the failing queue (or the whole function) and
 * failing the work that was on it; survives removal with files open.
 */

#include <linux/device.h>
#include <linux/dma-mapping.h>
#include <linux/file.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/io.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/pid.h>
#include <linux/sched.h>
#include <linux/slab.h>

#include "vgpu_drv.h"

static unsigned int vgpu_queues = 4;
module_param_named(queues, vgpu_queues, uint, 0444);
MODULE_PARM_DESC(queues,
		 "Queues used per function (default 4, at most what the device offers); open files and lanes are spread over them");

static unsigned int vgpu_ring_size = VGPU_MAX_QUEUE_SIZE;
module_param_named(ring_size, vgpu_ring_size, uint, 0444);
MODULE_PARM_DESC(ring_size,
		 "Descriptors per ring, a power of two (default and most: MAX_QUEUE_SIZE)");

static bool vgpu_polled;
module_param_named(polled, vgpu_polled, bool, 0444);
MODULE_PARM_DESC(polled,
		 "Polled queues: the device polls the doorbell page (default off)");

unsigned int vgpu_poll_spin_us = 20;
module_param_named(poll_spin_us, vgpu_poll_spin_us, uint, 0644);
MODULE_PARM_DESC(poll_spin_us,
		 "Polled queues: microseconds a wait polls before sleeping (default 20)");

static bool vgpu_force_intx;
module_param_named(force_intx, vgpu_force_intx, bool, 0444);
MODULE_PARM_DESC(force_intx, "Use INTx even when MSI-X is available (default off)");

static unsigned int vgpu_watchdog_ms = 1000;
module_param_named(watchdog_ms, vgpu_watchdog_ms, uint, 0444);
MODULE_PARM_DESC(watchdog_ms,
		 "Milliseconds between health checks while work is queued, 0: off (default 1000)");

struct workqueue_struct *vgpu_wq;

static dev_t vgpu_devt;
static DEFINE_MUTEX(vgpu_minor_lock);
static DEFINE_IDR(vgpu_minor_idr);

static const struct class vgpu_class = {
	.name = VGPU_NAME,
};

int vgpu_status_errno(u32 status)
{
	switch (status) {
	case VGPU_STATUS_OK:
		return 0;
	case VGPU_STATUS_INVALID:
		return -EINVAL;
	case VGPU_STATUS_FAULT:
		return -EFAULT;
	case VGPU_STATUS_NO_MEMORY:
		return -ENOMEM;
	case VGPU_STATUS_UNSUPPORTED:
		return -EOPNOTSUPP;
	case VGPU_STATUS_NOT_FOUND:
		return -ENOENT;
	case VGPU_STATUS_CANCELLED:
		return -ECANCELED;
	case VGPU_STATUS_OUT_OF_RANGE:
		return -ERANGE;
	case VGPU_STATUS_CONTEXT_LOST:
		return -ENOTRECOVERABLE;
	default:
		return -EIO;
	}
}

/* ---- lifetimes ------------------------------------------------------------ */

static void vgpu_dev_release(struct kref *ref)
{
	struct vgpu_dev *vdev = container_of(ref, struct vgpu_dev, ref);

	kfree(vdev->queues);
	kfree(vdev->vecs);
	ida_destroy(&vdev->ctx_ida);
	pci_dev_put(vdev->pdev);
	kfree(vdev);
}

void vgpu_dev_put(struct vgpu_dev *vdev)
{
	kref_put(&vdev->ref, vgpu_dev_release);
}

static void vgpu_file_release_ref(struct kref *ref)
{
	struct vgpu_file *vf = container_of(ref, struct vgpu_file, ref);

	vgpu_res_drop_all(vf);
	xa_destroy(&vf->batches);
	/* Nothing carries the id any more: the context was destroyed. */
	if (vf->ctx)
		ida_free(&vf->vdev->ctx_ida, vf->ctx);
	if (vf->owner)
		vgpu_file_put(vf->owner);
	put_pid(vf->tgid);
	vgpu_dev_put(vf->vdev);
	kfree(vf);
}

void vgpu_file_put(struct vgpu_file *vf)
{
	kref_put(&vf->ref, vgpu_file_release_ref);
}

/* ---- errors and recovery --------------------------------------------------- */

void vgpu_schedule_recovery(struct vgpu_dev *vdev)
{
	if (READ_ONCE(vdev->dead))
		return;
	kref_get(&vdev->ref);
	if (!queue_work(vgpu_wq, &vdev->err_work))
		vgpu_dev_put(vdev);
}

static const char *vgpu_error_name(u32 code)
{
	switch (code) {
	case VGPU_ERR_RING_ADDRESS:
		return "ring address";
	case VGPU_ERR_RING_CORRUPT:
		return "ring corrupt";
	case VGPU_ERR_QUEUE_CONFIG:
		return "queue configuration";
	case VGPU_ERR_REGISTER:
		return "register access";
	case VGPU_ERR_BACKEND:
		return "backend";
	default:
		return "unknown";
	}
}

/* Logs the error log entries added since the last look. */
static void vgpu_log_errors(struct vgpu_dev *vdev, u32 count)
{
	struct device *dev = &vdev->pdev->dev;
	u32 n, i;

	/* The count went back: the function was reset, the log cleared. */
	if (count < vdev->err_seen)
		vdev->err_seen = 0;
	n = count - vdev->err_seen;
	if (!n)
		return;
	if (n > VGPU_ERROR_LOG_ENTRIES) {
		dev_warn(dev, "%u device errors overwritten in the error log\n",
			 n - (u32)VGPU_ERROR_LOG_ENTRIES);
		n = VGPU_ERROR_LOG_ENTRIES;
	}
	for (i = count - n; i != count; i++) {
		void __iomem *e = vdev->regs + VGPU_ERROR_LOG_OFFSET +
				  (i % VGPU_ERROR_LOG_ENTRIES) *
				  sizeof(struct vgpu_error_entry);
		u32 code = readl(e + offsetof(struct vgpu_error_entry, code));
		u32 queue = readl(e + offsetof(struct vgpu_error_entry, queue));
		u64 detail = lo_hi_readq(e + offsetof(struct vgpu_error_entry,
						      detail));

		dev_warn_ratelimited(dev,
				     "device error %u (%s), queue %u, detail %#llx\n",
				     code, vgpu_error_name(code), queue, detail);
	}
	vdev->err_seen = count;
}

/*
 * MEM_SIZE, read until two reads agree: with FEATURE_RESIZE the host may
 * change it between the halves of a 64-bit read.
 */
static u64 vgpu_read_mem_size(struct vgpu_dev *vdev)
{
	u64 a, b = readq(vdev->regs + VGPU_REG_MEM_SIZE);
	int tries = 4;

	do {
		a = b;
		b = readq(vdev->regs + VGPU_REG_MEM_SIZE);
	} while (a != b && --tries);
	return b;
}

/* IRQ_CAUSE_CONFIG: the host resized the partition's memory. */
static void vgpu_config_changed(struct vgpu_dev *vdev)
{
	u64 size = vgpu_read_mem_size(vdev);
	u64 old = READ_ONCE(vdev->mem_size);

	if (size == old || size == U64_MAX)
		return;
	WRITE_ONCE(vdev->mem_size, size);
	dev_info(&vdev->pdev->dev, "vgpu%d: device memory now %llu MiB (was %llu MiB)\n",
		 vdev->minor, size >> 20, old >> 20);
}

/*
 * Enables the function and its queues: at probe and after a function
 * reset. hw_lock held (or not yet visible).
 */
static int vgpu_hw_start(struct vgpu_dev *vdev)
{
	void __iomem *regs = vdev->regs;
	unsigned int i;
	int ret = 0;

	/* With MSI-X, no cause may fall back to INTx. */
	writel(vdev->msix ? VGPU_IRQ_CAUSE_QUEUE | VGPU_IRQ_CAUSE_ERROR |
			    VGPU_IRQ_CAUSE_CONFIG : 0,
	       regs + VGPU_REG_IRQ_MASK);
	writel(VGPU_IRQ_CAUSE_QUEUE | VGPU_IRQ_CAUSE_ERROR |
	       VGPU_IRQ_CAUSE_CONFIG, regs + VGPU_REG_IRQ_CAUSE);
	/* A resize while the function was down is read here. */
	vgpu_config_changed(vdev);
	writel(VGPU_CONTROL_ENABLE, regs + VGPU_REG_CONTROL);
	for (i = 0; i < vdev->nq; i++) {
		int r = vgpu_queue_hw_enable(&vdev->queues[i]);

		vgpu_queue_resume(&vdev->queues[i], r != 0);
		if (r)
			ret = r;
	}
	vdev->err_seen = readl(regs + VGPU_REG_ERROR_COUNT);
	return ret;
}

/* CONTROL_RESET; the device also resets its PCI command register. */
static void vgpu_hw_reset(struct vgpu_dev *vdev)
{
	writel(VGPU_CONTROL_RESET, vdev->regs + VGPU_REG_CONTROL);
	readl(vdev->regs + VGPU_REG_STATUS);
	pci_write_config_word(vdev->pdev, PCI_COMMAND, vdev->pci_cmd);
}

/*
 * The function lost its state (fatal error, or reset by the VMM): device
 * memory and modules are gone, so are the allocations files recorded
 * (vgpu_dev.gen), and every queued command fails with -EIO.
 */
static void vgpu_function_reset(struct vgpu_dev *vdev, const char *why)
{
	unsigned int i;

	dev_warn(&vdev->pdev->dev,
		 "%s: resetting the function; device memory is lost\n", why);
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_set_broken(&vdev->queues[i]);
	vgpu_hw_reset(vdev);
	/* No queue accepts work now, so no submission sees half of this. */
	WRITE_ONCE(vdev->gen, vdev->gen + 1);
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_fail_and_reset(&vdev->queues[i], -EIO);
	if (vgpu_hw_start(vdev))
		dev_err(&vdev->pdev->dev, "function did not restart\n");
	atomic_inc(&vdev->recoveries);
}

static void vgpu_err_work(struct work_struct *work)
{
	struct vgpu_dev *vdev = container_of(work, struct vgpu_dev, err_work);
	u32 status, qs, qerr;
	unsigned int i;

	down_read(&vdev->hw_lock);
	if (vdev->dead)
		goto out;
	status = readl(vdev->regs + VGPU_REG_STATUS);
	if (status == U32_MAX && !pci_device_is_present(vdev->pdev)) {
		dev_err_ratelimited(&vdev->pdev->dev, "device is gone\n");
		goto out;
	}
	writel(VGPU_IRQ_CAUSE_ERROR, vdev->regs + VGPU_REG_IRQ_CAUSE);
	vgpu_log_errors(vdev, readl(vdev->regs + VGPU_REG_ERROR_COUNT));
	if ((readl(vdev->regs + VGPU_REG_IRQ_CAUSE) & VGPU_IRQ_CAUSE_CONFIG) ||
	    xchg(&vdev->config_changed, false)) {
		writel(VGPU_IRQ_CAUSE_CONFIG, vdev->regs + VGPU_REG_IRQ_CAUSE);
		vgpu_config_changed(vdev);
	}

	if (status & VGPU_STATUS_FATAL) {
		vgpu_function_reset(vdev, "fatal device error");
		goto out;
	}
	if (!(status & VGPU_STATUS_ENABLED)) {
		vgpu_function_reset(vdev, "function was reset behind the driver");
		goto out;
	}
	for (i = 0; i < vdev->nq; i++) {
		struct vgpu_queue *q = &vdev->queues[i];

		qs = vgpu_queue_hw_status(q, &qerr);
		if (qs & VGPU_QSTATUS_ERROR)
			dev_warn(&vdev->pdev->dev, "queue %u: error %u (%s)\n",
				 i, qerr, vgpu_error_name(qerr));
		if ((qs & VGPU_QSTATUS_ERROR) || !(qs & VGPU_QSTATUS_ENABLED) ||
		    vgpu_queue_needs_reset(q))
			vgpu_queue_recover(q);
	}
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_reap(&vdev->queues[i]);
out:
	up_read(&vdev->hw_lock);
	vgpu_dev_put(vdev);	/* taken by vgpu_schedule_recovery() */
}

/*
 * While work is queued: reap in case an interrupt was lost, and let the
 * error worker look at the function and queue states, to notice a reset
 * or a disabled queue that raised no error interrupt (the VMM's
 * DEVICE_RESET, a reconnect), which would otherwise hang the waiters.
 */
static void vgpu_watchdog_work(struct work_struct *work)
{
	struct vgpu_dev *vdev = container_of(to_delayed_work(work),
					     struct vgpu_dev, watchdog);
	bool busy = false;
	unsigned int i;

	for (i = 0; i < vdev->nq; i++) {
		vgpu_queue_reap(&vdev->queues[i]);
		busy |= vgpu_queue_busy(&vdev->queues[i]);
	}
	if (busy)
		vgpu_schedule_recovery(vdev);
	if (!READ_ONCE(vdev->dead))
		queue_delayed_work(vgpu_wq, &vdev->watchdog,
				   msecs_to_jiffies(vgpu_watchdog_ms));
}

/* ---- interrupts ------------------------------------------------------------- */

static irqreturn_t vgpu_irq_queue(int irq, void *data)
{
	struct vgpu_vec *v = data;
	struct vgpu_dev *vdev = v->vdev;
	unsigned int i;

	for (i = 0; i < vdev->nq; i++)
		if (vdev->queues[i].vector == v->index)
			vgpu_queue_reap(&vdev->queues[i]);
	return IRQ_HANDLED;
}

static irqreturn_t vgpu_irq_error(int irq, void *data)
{
	struct vgpu_vec *v = data;

	vgpu_schedule_recovery(v->vdev);
	return IRQ_HANDLED;
}

/* One vector for everything: MSI-X with a single vector, or INTx. */
static irqreturn_t vgpu_irq_shared(int irq, void *data)
{
	struct vgpu_vec *v = data;
	struct vgpu_dev *vdev = v->vdev;
	unsigned int i;
	u32 cause;

	cause = readl(vdev->regs + VGPU_REG_IRQ_CAUSE);
	if (cause == U32_MAX)
		return IRQ_NONE;
	if (!cause && !vdev->msix)
		return IRQ_NONE;
	if (cause)
		writel(cause, vdev->regs + VGPU_REG_IRQ_CAUSE);
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_reap(&vdev->queues[i]);
	if (cause & VGPU_IRQ_CAUSE_CONFIG)
		WRITE_ONCE(vdev->config_changed, true);
	if (cause & (VGPU_IRQ_CAUSE_ERROR | VGPU_IRQ_CAUSE_CONFIG))
		vgpu_schedule_recovery(vdev);
	return IRQ_HANDLED;
}

static void vgpu_free_irqs(struct vgpu_dev *vdev)
{
	int i;

	for (i = 0; i < vdev->nvec; i++) {
		struct vgpu_vec *v = &vdev->vecs[i];

		if (v->requested) {
			free_irq(pci_irq_vector(vdev->pdev, i), v);
			v->requested = false;
		}
	}
}

/*
 * One error vector and one per queue; with fewer MSI-X vectors queues
 * share them, with one vector (or INTx) a single handler reads IRQ_CAUSE.
 */
static int vgpu_setup_irqs(struct vgpu_dev *vdev)
{
	struct pci_dev *pdev = vdev->pdev;
	unsigned int i;
	int nvec = -ENODEV, ret;

	if (!vgpu_force_intx)
		nvec = pci_alloc_irq_vectors(pdev, 1, 1 + vdev->nq,
					     PCI_IRQ_MSIX);
	if (nvec < 0)
		nvec = pci_alloc_irq_vectors(pdev, 1, 1, PCI_IRQ_INTX);
	if (nvec < 0)
		return nvec;
	vdev->nvec = nvec;
	vdev->msix = pdev->msix_enabled;

	for (i = 0; i < vdev->nq; i++) {
		struct vgpu_queue *q = &vdev->queues[i];

		if (!vdev->msix)
			q->vector = i + 1;	/* anything but "none" raises INTx */
		else if (nvec == 1)
			q->vector = 0;
		else
			q->vector = 1 + i % (nvec - 1);
	}

	vdev->vecs = kcalloc(nvec, sizeof(*vdev->vecs), GFP_KERNEL);
	if (!vdev->vecs)
		return -ENOMEM;
	for (i = 0; i < nvec; i++) {
		struct vgpu_vec *v = &vdev->vecs[i];
		irq_handler_t fn;

		v->vdev = vdev;
		v->index = i;
		if (nvec == 1) {
			fn = vgpu_irq_shared;
			snprintf(v->name, sizeof(v->name), "vgpu%d", vdev->minor);
		} else if (i == VGPU_MSIX_ERROR_VECTOR) {
			fn = vgpu_irq_error;
			snprintf(v->name, sizeof(v->name), "vgpu%d-err",
				 vdev->minor);
		} else {
			fn = vgpu_irq_queue;
			snprintf(v->name, sizeof(v->name), "vgpu%d-q%u",
				 vdev->minor, i - 1);
		}
		ret = request_irq(pci_irq_vector(pdev, i), fn,
				  vdev->msix ? 0 : IRQF_SHARED, v->name, v);
		if (ret) {
			vgpu_free_irqs(vdev);
			return ret;
		}
		v->requested = true;
	}
	return 0;
}

/* ---- character device --------------------------------------------------------- */

/*
 * A function whose partition lost its state (STATUS.FATAL: a kernel fault
 * ended its GPU context) is reset by the error worker. A new user waits
 * for that, and for any recovery in progress, so the reset never happens
 * under its first commands.
 */
static void vgpu_settle(struct vgpu_dev *vdev)
{
	u32 status = 0;

	down_read(&vdev->hw_lock);
	if (!vdev->dead)
		status = readl(vdev->regs + VGPU_REG_STATUS);
	up_read(&vdev->hw_lock);
	if (status != U32_MAX && (status & VGPU_STATUS_FATAL))
		vgpu_schedule_recovery(vdev);
	flush_work(&vdev->err_work);
}

static int vgpu_open(struct inode *inode, struct file *filp)
{
	struct vgpu_dev *vdev;
	struct vgpu_file *vf;
	int id;

	mutex_lock(&vgpu_minor_lock);
	vdev = idr_find(&vgpu_minor_idr, iminor(inode));
	if (vdev)
		kref_get(&vdev->ref);
	mutex_unlock(&vgpu_minor_lock);
	if (!vdev)
		return -ENODEV;
	vgpu_settle(vdev);

	vf = kzalloc(sizeof(*vf), GFP_KERNEL);
	if (!vf) {
		vgpu_dev_put(vdev);
		return -ENOMEM;
	}
	kref_init(&vf->ref);
	vf->vdev = vdev;
	vf->filp = filp;
	vf->tgid = get_pid(task_tgid(current));
	mutex_init(&vf->submit_lock);
	spin_lock_init(&vf->res_lock);
	vf->allocs = RB_ROOT;
	vf->vas = RB_ROOT;
	vf->phys = RB_ROOT;
	INIT_LIST_HEAD(&vf->modules);
	mutex_init(&vf->pin_lock);
	INIT_LIST_HEAD(&vf->pinned);
	xa_init(&vf->batches);
	atomic_set(&vf->nrecords, 0);
	vf->next_seq = 1;
	init_waitqueue_head(&vf->wq);
	INIT_WORK(&vf->cleanup_work, vgpu_file_cleanup_work);
	atomic_set(&vf->ctx_users, 1);

	/*
	 * A context of its own, so that a fault ends this file's work only;
	 * the device makes it with the file's first command needing one.
	 */
	if (vdev->contexts) {
		id = ida_alloc_range(&vdev->ctx_ida, 1, VGPU_MAX_CONTEXT_ID,
				     GFP_KERNEL);
		if (id < 0) {
			vgpu_file_put(vf);
			return id == -ENOSPC ? -ENFILE : id;
		}
		vf->ctx = id;
	}

	mutex_lock(&vdev->files_lock);
	if (vdev->dead) {
		mutex_unlock(&vdev->files_lock);
		vgpu_file_put(vf);
		return -ENODEV;
	}
	vf->res_gen = READ_ONCE(vdev->gen);
	vf->q = &vdev->queues[vdev->next_queue++ % vdev->nq];
	list_add_tail(&vf->link, &vdev->files);
	vdev->nfiles++;
	mutex_unlock(&vdev->files_lock);

	filp->private_data = vf;
	return nonseekable_open(inode, filp);
}

/*
 * Close: forget uncollected fences and free the file's device memory and
 * modules. If the file still has work on the ring, that happens when the
 * work completes (vgpu_file_cleanup_work()) and close does not wait;
 * otherwise close waits a little for the frees (VGPU_CLOSE_WAIT at most).
 */
static int vgpu_release(struct inode *inode, struct file *filp)
{
	struct vgpu_file *vf = filp->private_data;
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_batch *b;
	unsigned long idx, flags;
	bool idle;

	mutex_lock(&vdev->files_lock);
	list_del(&vf->link);
	vdev->nfiles--;
	mutex_unlock(&vdev->files_lock);

	xa_for_each(&vf->batches, idx, b) {
		xa_erase(&vf->batches, idx);
		vgpu_batch_put(b);
	}
	atomic_set(&vf->nrecords, 0);
	vgpu_unpin_all(vf);

	spin_lock_irqsave(&vf->q->lock, flags);
	vf->closing = true;
	idle = !vf->inflight;
	spin_unlock_irqrestore(&vf->q->lock, flags);
	if (idle)
		vgpu_file_cleanup(vf, true);
	return 0;
}

static const struct file_operations vgpu_fops;

/*
 * VGPU_IOCTL_LANE: see the uapi header. The file moves to the queue after
 * its owner's and the owner's other lanes', round robin.
 */
long vgpu_ioctl_lane(struct vgpu_file *vf, void __user *arg)
{
	struct vgpu_dev *vdev = vf->vdev;
	struct vgpu_file *owner;
	struct vgpu_lane a;
	struct fd f;
	unsigned long flags;
	unsigned int idx;
	bool fresh;
	long ret;

	if (copy_from_user(&a, arg, sizeof(a)))
		return -EFAULT;
	f = fdget(a.fd);
	if (!fd_file(f))
		return -EBADF;
	if (fd_file(f)->f_op != &vgpu_fops) {
		ret = -EINVAL;
		goto out_fd;
	}
	owner = fd_file(f)->private_data;
	if (owner == vf || owner->vdev != vdev || owner->owner) {
		ret = -EINVAL;
		goto out_fd;
	}
	ret = mutex_lock_killable(&vf->submit_lock);
	if (ret)
		goto out_fd;
	spin_lock_irqsave(&vf->q->lock, flags);
	fresh = !vf->inflight && !vf->queued;
	spin_unlock_irqrestore(&vf->q->lock, flags);
	spin_lock_irqsave(&vf->res_lock, flags);
	fresh = fresh && !vf->nallocs && !vf->nmodules &&
		RB_EMPTY_ROOT(&vf->allocs) && RB_EMPTY_ROOT(&vf->vas) &&
		RB_EMPTY_ROOT(&vf->phys);
	spin_unlock_irqrestore(&vf->res_lock, flags);
	if (!fresh || vf->owner || vf->nlanes || vf->next_seq != 1 ||
	    READ_ONCE(vf->npinned)) {
		ret = -EBUSY;
		goto out_unlock;
	}
	mutex_lock(&vdev->files_lock);
	idx = (owner->q - vdev->queues) + 1 + owner->nlanes++;
	vf->q = &vdev->queues[idx % vdev->nq];
	mutex_unlock(&vdev->files_lock);
	kref_get(&owner->ref);
	vf->owner = owner;
	/*
	 * The lane's commands carry the owner's context. Its own id was
	 * never on the ring (fresh), so it goes back at once.
	 */
	if (vf->ctx) {
		ida_free(&vdev->ctx_ida, vf->ctx);
		vf->ctx = 0;
	}
	atomic_inc(&owner->ctx_users);
	a.queue = vf->q - vdev->queues;
	ret = copy_to_user(arg, &a, sizeof(a)) ? -EFAULT : 0;
out_unlock:
	mutex_unlock(&vf->submit_lock);
out_fd:
	fdput(f);
	return ret;
}

static vm_fault_t vgpu_vm_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct vgpu_file *vf = vma->vm_private_data;
	struct vgpu_dev *vdev = vf->vdev;
	unsigned long pgoff = vma->vm_pgoff +
			      ((vmf->address - vma->vm_start) >> PAGE_SHIFT);
	vm_fault_t ret;

	down_read(&vdev->map_lock);
	if (vdev->dead || pgoff >= (vdev->win_size >> PAGE_SHIFT))
		ret = VM_FAULT_SIGBUS;
	else
		ret = vmf_insert_pfn(vma, vmf->address & PAGE_MASK,
				     PHYS_PFN(vdev->win_phys) + pgoff);
	up_read(&vdev->map_lock);
	return ret;
}

static const struct vm_operations_struct vgpu_vm_ops = {
	.fault = vgpu_vm_fault,
};

/*
 * The window (BAR2) at file offset 0. Pages are inserted on fault so that
 * remove() can revoke every mapping and later faults get SIGBUS.
 */
static int vgpu_mmap(struct file *filp, struct vm_area_struct *vma)
{
	struct vgpu_file *vf = filp->private_data;
	struct vgpu_dev *vdev = vf->vdev;
	unsigned long win_pages = vdev->win_size >> PAGE_SHIFT;
	unsigned long pages = vma_pages(vma);

	if (!win_pages)
		return -ENODEV;
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	if (vma->vm_pgoff >= win_pages || pages > win_pages - vma->vm_pgoff)
		return -EINVAL;
	if (READ_ONCE(vdev->dead))
		return -ENODEV;

	vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
	vma->vm_page_prot = pgprot_writecombine(vma->vm_page_prot);
	vma->vm_ops = &vgpu_vm_ops;
	vma->vm_private_data = vf;
	return 0;
}

static const struct file_operations vgpu_fops = {
	.owner = THIS_MODULE,
	.open = vgpu_open,
	.release = vgpu_release,
	.unlocked_ioctl = vgpu_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = vgpu_mmap,
};

static void vgpu_zap_mappings(struct vgpu_dev *vdev)
{
	struct vgpu_file *vf;

	down_write(&vdev->map_lock);
	mutex_lock(&vdev->files_lock);
	list_for_each_entry(vf, &vdev->files, link)
		unmap_mapping_range(vf->filp->f_mapping, 0, 0, 1);
	mutex_unlock(&vdev->files_lock);
	up_write(&vdev->map_lock);
}

static void vgpu_minor_free(struct vgpu_dev *vdev)
{
	mutex_lock(&vgpu_minor_lock);
	idr_remove(&vgpu_minor_idr, vdev->minor);
	mutex_unlock(&vgpu_minor_lock);
}

static void vgpu_chardev_del(struct vgpu_dev *vdev)
{
	if (vdev->chardev)
		device_destroy(&vgpu_class,
			       MKDEV(MAJOR(vgpu_devt), vdev->minor));
	if (vdev->cdev)
		cdev_del(vdev->cdev);
	vdev->chardev = NULL;
	vdev->cdev = NULL;
}

static int vgpu_chardev_add(struct vgpu_dev *vdev)
{
	dev_t devt = MKDEV(MAJOR(vgpu_devt), vdev->minor);
	struct device *chardev;
	int ret;

	vdev->cdev = cdev_alloc();
	if (!vdev->cdev)
		return -ENOMEM;
	vdev->cdev->owner = THIS_MODULE;
	vdev->cdev->ops = &vgpu_fops;
	ret = cdev_add(vdev->cdev, devt, 1);
	if (ret) {
		kobject_put(&vdev->cdev->kobj);
		vdev->cdev = NULL;
		return ret;
	}
	chardev = device_create(&vgpu_class, &vdev->pdev->dev, devt, vdev,
				"vgpu%d", vdev->minor);
	if (IS_ERR(chardev))
		return PTR_ERR(chardev);
	vdev->chardev = chardev;
	return 0;
}

/* ---- PCI ------------------------------------------------------------------------- */

static int vgpu_read_identity(struct vgpu_dev *vdev)
{
	struct pci_dev *pdev = vdev->pdev;
	struct device *dev = &pdev->dev;
	void __iomem *regs = vdev->regs;
	u32 magic, dboff;

	magic = readl(regs + VGPU_REG_MAGIC);
	if (magic != VGPU_ABI_MAGIC) {
		dev_err(dev, "not a vgpu function (magic %#x)\n", magic);
		return -ENODEV;
	}
	vdev->version = readl(regs + VGPU_REG_VERSION);
	if (vdev->version >> 16 != VGPU_ABI_VERSION_MAJOR) {
		dev_err(dev, "ABI %u.%u is not supported (need %llu.x)\n",
			vdev->version >> 16, vdev->version & 0xffff,
			VGPU_ABI_VERSION_MAJOR);
		return -ENODEV;
	}
	vdev->features = readq(regs + VGPU_REG_FEATURES);
	if (vdev->features & VGPU_FEATURE_CONTEXTS) {
		vdev->contexts = true;
		vdev->max_contexts = readl(regs + VGPU_REG_MAX_CONTEXTS);
		/* ABI 1.7: what a context holds of its own. */
		if ((vdev->version & 0xffff) >= 7)
			vdev->context_cost =
				readq(regs + VGPU_REG_CONTEXT_COST);
	}
	vdev->mem_size = readq(regs + VGPU_REG_MEM_SIZE);
	vdev->compute_units = readl(regs + VGPU_REG_COMPUTE_UNITS);
	vdev->max_queues = readl(regs + VGPU_REG_MAX_QUEUES);
	vdev->max_queue_size = readl(regs + VGPU_REG_MAX_QUEUE_SIZE);
	dboff = readl(regs + VGPU_REG_DOORBELL_OFFSET);

	if (!vdev->max_queues || vdev->max_queues > VGPU_MAX_QUEUES) {
		dev_err(dev, "device offers %u queues\n", vdev->max_queues);
		return -ENODEV;
	}
	if (dboff % VGPU_DOORBELL_STRIDE ||
	    dboff < VGPU_QUEUE_REGS_OFFSET +
		    VGPU_MAX_QUEUES * VGPU_QUEUE_REGS_STRIDE ||
	    dboff + vdev->max_queues * VGPU_DOORBELL_STRIDE >
		    pci_resource_len(pdev, VGPU_BAR_REGS)) {
		dev_err(dev, "doorbell page at %#x does not fit BAR0\n", dboff);
		return -ENODEV;
	}
	vdev->db = regs + dboff;
	return 0;
}

/* The host-visible window, if the device offers one. */
static void vgpu_setup_window(struct vgpu_dev *vdev)
{
	struct pci_dev *pdev = vdev->pdev;
	u64 reg = readq(vdev->regs + VGPU_REG_WINDOW_SIZE);
	u64 len = pci_resource_len(pdev, VGPU_BAR_WINDOW);

	if (vdev->features & VGPU_FEATURE_WINDOW)
		vdev->win_dev_size = reg;
	if (!(vdev->features & VGPU_FEATURE_WINDOW) || !reg || !len ||
	    !(pci_resource_flags(pdev, VGPU_BAR_WINDOW) & IORESOURCE_MEM))
		return;
	if (pcim_request_region(pdev, VGPU_BAR_WINDOW, VGPU_NAME)) {
		dev_warn(&pdev->dev, "window BAR is busy; mmap disabled\n");
		return;
	}
	vdev->win_phys = pci_resource_start(pdev, VGPU_BAR_WINDOW);
	vdev->win_size = ALIGN_DOWN(min(reg, len), PAGE_SIZE);
	/* Write-combining user mappings; UC- if this fails. */
	if (vdev->win_size)
		devm_arch_io_reserve_memtype_wc(&pdev->dev, vdev->win_phys,
						vdev->win_size);
}

static int vgpu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct device *dev = &pdev->dev;
	struct vgpu_dev *vdev;
	unsigned int i, qsize;
	int ret;

	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;

	vdev = kzalloc(sizeof(*vdev), GFP_KERNEL);
	if (!vdev)
		return -ENOMEM;
	kref_init(&vdev->ref);
	vdev->pdev = pci_dev_get(pdev);
	init_rwsem(&vdev->hw_lock);
	init_rwsem(&vdev->map_lock);
	mutex_init(&vdev->files_lock);
	INIT_LIST_HEAD(&vdev->files);
	INIT_WORK(&vdev->err_work, vgpu_err_work);
	INIT_DELAYED_WORK(&vdev->watchdog, vgpu_watchdog_work);
	atomic_set(&vdev->recoveries, 0);
	ida_init(&vdev->ctx_ida);

	mutex_lock(&vgpu_minor_lock);
	vdev->minor = idr_alloc(&vgpu_minor_idr, NULL, 0, VGPU_MAX_MINORS,
				GFP_KERNEL);
	mutex_unlock(&vgpu_minor_lock);
	if (vdev->minor < 0) {
		ret = vdev->minor;
		goto err_put;
	}

	if (!(pci_resource_flags(pdev, VGPU_BAR_REGS) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, VGPU_BAR_REGS) < VGPU_BAR0_SIZE) {
		dev_err(dev, "BAR0 is missing or too small\n");
		ret = -ENODEV;
		goto err_minor;
	}
	vdev->regs = pcim_iomap_region(pdev, VGPU_BAR_REGS, VGPU_NAME);
	if (IS_ERR(vdev->regs)) {
		ret = PTR_ERR(vdev->regs);
		goto err_minor;
	}
	ret = vgpu_read_identity(vdev);
	if (ret)
		goto err_minor;
	vgpu_setup_window(vdev);

	pci_set_master(pdev);
	ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(64));
	if (ret)
		ret = dma_set_mask_and_coherent(dev, DMA_BIT_MASK(32));
	if (ret) {
		dev_err(dev, "no usable DMA mask\n");
		goto err_minor;
	}
	dma_set_max_seg_size(dev, UINT_MAX);
	pci_read_config_word(pdev, PCI_COMMAND, &vdev->pci_cmd);

	/* Start from the power-on state, whatever ran before. */
	vgpu_hw_reset(vdev);

	qsize = min3(vgpu_ring_size, vdev->max_queue_size,
		     (u32)VGPU_MAX_QUEUE_SIZE);
	if (qsize < 4) {
		dev_err(dev, "rings of %u entries are too small\n", qsize);
		ret = -EINVAL;
		goto err_minor;
	}
	vdev->qsize = rounddown_pow_of_two(qsize);
	vdev->nq = clamp(vgpu_queues, 1U, vdev->max_queues);
	vdev->polled = vgpu_polled && (vdev->features & VGPU_FEATURE_POLLED);
	if (vgpu_polled && !vdev->polled)
		dev_info(dev, "device has no polled queues; using interrupts\n");

	vdev->queues = kcalloc(vdev->nq, sizeof(*vdev->queues), GFP_KERNEL);
	if (!vdev->queues) {
		ret = -ENOMEM;
		goto err_minor;
	}
	for (i = 0; i < vdev->nq; i++) {
		vdev->queues[i].polled = vdev->polled;
		ret = vgpu_queue_init(vdev, &vdev->queues[i], i, vdev->qsize);
		if (ret)
			goto err_queues;
	}

	ret = vgpu_setup_irqs(vdev);
	if (ret) {
		dev_err(dev, "interrupt setup failed: %d\n", ret);
		goto err_vectors;
	}
	/* An error interrupt during the start waits for its outcome. */
	down_write(&vdev->hw_lock);
	ret = vgpu_hw_start(vdev);
	if (ret)
		WRITE_ONCE(vdev->dead, true);
	up_write(&vdev->hw_lock);
	if (ret)
		goto err_hw;
	ret = vgpu_chardev_add(vdev);
	if (ret)
		goto err_cdev;

	pci_set_drvdata(pdev, vdev);
	mutex_lock(&vgpu_minor_lock);
	idr_replace(&vgpu_minor_idr, vdev, vdev->minor);
	mutex_unlock(&vgpu_minor_lock);
	if (vgpu_watchdog_ms)
		queue_delayed_work(vgpu_wq, &vdev->watchdog,
				   msecs_to_jiffies(vgpu_watchdog_ms));

	dev_info(dev,
		 "vgpu%d: ABI %u.%u, %llu MiB, %u CUs, %u/%u queues x%u, %s, %s, window %llu KiB\n",
		 vdev->minor, vdev->version >> 16, vdev->version & 0xffff,
		 vdev->mem_size >> 20, vdev->compute_units, vdev->nq,
		 vdev->max_queues, vdev->qsize,
		 vdev->polled ? "polled" : "irq",
		 vdev->msix ? "MSI-X" : "INTx", vdev->win_size >> 10);
	if (vdev->contexts)
		dev_info(dev, "vgpu%d: a context per open file, %u at once\n",
			 vdev->minor, vdev->max_contexts);
	return 0;

err_cdev:
	vgpu_chardev_del(vdev);
err_hw:
	WRITE_ONCE(vdev->dead, true);
	vgpu_free_irqs(vdev);
	if (cancel_work_sync(&vdev->err_work))
		vgpu_dev_put(vdev);
	vgpu_hw_reset(vdev);
err_vectors:
	pci_free_irq_vectors(pdev);
err_queues:
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_free_mem(&vdev->queues[i]);
err_minor:
	vgpu_minor_free(vdev);
err_put:
	vgpu_dev_put(vdev);
	return ret;
}

/*
 * Works with files still open and with a device that is already gone:
 * stop new work, quiesce the device if it is there, fail what was queued
 * (-ENODEV), revoke window mappings and free the rings. Open files keep
 * vgpu_dev alive and see -ENODEV from then on.
 */
static void vgpu_remove(struct pci_dev *pdev)
{
	struct vgpu_dev *vdev = pci_get_drvdata(pdev);
	bool present = pci_device_is_present(pdev);
	unsigned int i;

	vgpu_minor_free(vdev);
	vgpu_chardev_del(vdev);

	mutex_lock(&vdev->files_lock);
	WRITE_ONCE(vdev->dead, true);
	mutex_unlock(&vdev->files_lock);
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_stop(&vdev->queues[i]);
	cancel_delayed_work_sync(&vdev->watchdog);
	vgpu_free_irqs(vdev);
	if (cancel_work_sync(&vdev->err_work))
		vgpu_dev_put(vdev);

	/* Waits for ioctls and workers that touch the device. */
	down_write(&vdev->hw_lock);
	if (present) {
		for (i = 0; i < vdev->nq; i++)
			vgpu_queue_hw_disable(&vdev->queues[i]);
		writel(VGPU_CONTROL_RESET, vdev->regs + VGPU_REG_CONTROL);
		readl(vdev->regs + VGPU_REG_STATUS);
	}
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_fail_and_reset(&vdev->queues[i], -ENODEV);
	up_write(&vdev->hw_lock);

	vgpu_zap_mappings(vdev);
	/* Unpin and unmap what the failed batches held. */
	flush_workqueue(vgpu_wq);
	for (i = 0; i < vdev->nq; i++)
		vgpu_queue_free_mem(&vdev->queues[i]);
	pci_free_irq_vectors(pdev);
	dev_info(&pdev->dev, "vgpu%d removed%s\n", vdev->minor,
		 present ? "" : " (device was gone)");
	vgpu_dev_put(vdev);
}

/* Stop DMA before a reboot or kexec. */
static void vgpu_shutdown(struct pci_dev *pdev)
{
	struct vgpu_dev *vdev = pci_get_drvdata(pdev);

	if (vdev && pci_device_is_present(pdev))
		writel(VGPU_CONTROL_RESET, vdev->regs + VGPU_REG_CONTROL);
}

static const struct pci_device_id vgpu_pci_ids[] = {
	{ PCI_DEVICE(VGPU_PCI_VENDOR_ID, VGPU_PCI_DEVICE_ID) },
	{ }
};
MODULE_DEVICE_TABLE(pci, vgpu_pci_ids);

static struct pci_driver vgpu_pci_driver = {
	.name = VGPU_NAME,
	.id_table = vgpu_pci_ids,
	.probe = vgpu_probe,
	.remove = vgpu_remove,
	.shutdown = vgpu_shutdown,
};

static int __init vgpu_init(void)
{
	int ret;

	vgpu_wq = alloc_workqueue("vgpu", WQ_UNBOUND, 0);
	if (!vgpu_wq)
		return -ENOMEM;
	ret = class_register(&vgpu_class);
	if (ret)
		goto err_wq;
	ret = alloc_chrdev_region(&vgpu_devt, 0, VGPU_MAX_MINORS, VGPU_NAME);
	if (ret)
		goto err_class;
	ret = pci_register_driver(&vgpu_pci_driver);
	if (ret)
		goto err_chrdev;
	return 0;

err_chrdev:
	unregister_chrdev_region(vgpu_devt, VGPU_MAX_MINORS);
err_class:
	class_unregister(&vgpu_class);
err_wq:
	destroy_workqueue(vgpu_wq);
	return ret;
}

static void __exit vgpu_exit(void)
{
	pci_unregister_driver(&vgpu_pci_driver);
	unregister_chrdev_region(vgpu_devt, VGPU_MAX_MINORS);
	class_unregister(&vgpu_class);
	destroy_workqueue(vgpu_wq);
	idr_destroy(&vgpu_minor_idr);
}

module_init(vgpu_init);
module_exit(vgpu_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("vgpud virtual GPU function driver");
