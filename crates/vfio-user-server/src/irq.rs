//! Interrupt state set by DEVICE_SET_IRQS: per type and vector, the eventfd
//! to signal, the mask bit and a pending bit. Device models raise
//! interrupts through [`Interrupts::trigger`] from any thread.

use std::fs::File;
use std::sync::{Arc, Mutex, MutexGuard};

use vgpu_sys::lock;
use vmm_sys_util::eventfd::EventFd;

/// Number of interrupt types of a VFIO PCI device.
pub const NUM_IRQ_TYPES: u32 = 5;
/// Interrupt type: legacy INTx.
pub const IRQ_INTX: u32 = 0;
/// Interrupt type: MSI.
pub const IRQ_MSI: u32 = 1;
/// Interrupt type: MSI-X.
pub const IRQ_MSIX: u32 = 2;
/// Interrupt type: error notification.
pub const IRQ_ERR: u32 = 3;
/// Interrupt type: device request (asks the client to release the device).
pub const IRQ_REQ: u32 = 4;

/// One interrupt type as the client sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrqInfo {
    /// Number of vectors; 0 when the type is absent.
    pub count: u32,
    /// Supports MASK / UNMASK.
    pub maskable: bool,
    /// Masks itself when it fires (level-triggered INTx).
    pub automasked: bool,
}

impl IrqInfo {
    /// Interrupt type `index` of the usual PCI function: a maskable INTx
    /// line that masks itself when it fires, `msix` MSI-X vectors, no MSI,
    /// and the error and request notifications.
    pub fn pci_function(index: u32, msix: u32) -> Self {
        match index {
            IRQ_INTX => IrqInfo {
                count: 1,
                maskable: true,
                automasked: true,
            },
            IRQ_MSIX => IrqInfo {
                count: msix,
                ..Default::default()
            },
            IRQ_ERR | IRQ_REQ => IrqInfo {
                count: 1,
                ..Default::default()
            },
            _ => IrqInfo::default(),
        }
    }
}

/// DATA_NONE: no data; act unconditionally.
pub const SET_DATA_NONE: u32 = 1 << 0;
/// DATA_BOOL: one byte per vector selects it.
pub const SET_DATA_BOOL: u32 = 1 << 1;
/// DATA_EVENTFD: one eventfd per vector in the message's fds.
pub const SET_DATA_EVENTFD: u32 = 1 << 2;
/// ACTION_MASK.
pub const SET_ACTION_MASK: u32 = 1 << 3;
/// ACTION_UNMASK.
pub const SET_ACTION_UNMASK: u32 = 1 << 4;
/// ACTION_TRIGGER.
pub const SET_ACTION_TRIGGER: u32 = 1 << 5;
const DATA_MASK: u32 = SET_DATA_NONE | SET_DATA_BOOL | SET_DATA_EVENTFD;
const ACTION_MASK: u32 = SET_ACTION_MASK | SET_ACTION_UNMASK | SET_ACTION_TRIGGER;

/// A SET_IRQS request that cannot be honoured.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum IrqError {
    /// Unknown interrupt type or absent one.
    #[error("interrupt type {0} does not exist")]
    Index(u32),
    /// Flags are not exactly one data and one action bit.
    #[error("flags {0:#x} are not one data type and one action")]
    Flags(u32),
    /// start + count is beyond the type's vectors.
    #[error("vectors {start}..+{count} out of range")]
    Range {
        /// First vector.
        start: u32,
        /// Number of vectors.
        count: u32,
    },
    /// The data part or the number of fds disagrees with `count`.
    #[error("data does not match count")]
    Data,
    /// The type cannot be masked, or masked with an eventfd.
    #[error("action not supported for this interrupt type")]
    Unsupported,
}

impl IrqError {
    /// The errno a reply carries.
    pub fn errno(&self) -> u32 {
        (match self {
            IrqError::Unsupported => libc::ENOTSUP,
            _ => libc::EINVAL,
        }) as u32
    }
}

#[derive(Default)]
struct Vector {
    trigger: Option<EventFd>,
    /// Signalled by the client to unmask (KVM's INTx resample eventfd,
    /// written when the guest ends the interrupt).
    unmask: Option<EventFd>,
    masked: bool,
    pending: bool,
}

#[derive(Default)]
struct IrqType {
    info: IrqInfo,
    vectors: Vec<Vector>,
}

/// Interrupt delivery for one device; cheap to clone.
#[derive(Clone, Default)]
pub struct Interrupts {
    inner: Arc<Mutex<Vec<IrqType>>>,
}

impl Interrupts {
    /// Interrupt state for the given per-type descriptions.
    pub fn new(infos: [IrqInfo; NUM_IRQ_TYPES as usize]) -> Self {
        let types = infos
            .into_iter()
            .map(|info| IrqType {
                info,
                vectors: (0..info.count).map(|_| Vector::default()).collect(),
            })
            .collect();
        Interrupts {
            inner: Arc::new(Mutex::new(types)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<IrqType>> {
        // Every update leaves the table consistent; ignore poisoning.
        lock(&self.inner)
    }

    /// `f` of vector `vector` of type `index` and the type's automask bit;
    /// `None` where there is no such vector.
    fn with_vector<R>(
        &self,
        index: u32,
        vector: u32,
        f: impl FnOnce(&mut Vector, bool) -> R,
    ) -> Option<R> {
        let mut types = self.lock();
        let t = types.get_mut(index as usize)?;
        let automask = t.info.automasked;
        t.vectors.get_mut(vector as usize).map(|v| f(v, automask))
    }

    /// Signals vector `vector` of type `index`. Returns whether an eventfd
    /// was signalled; a masked vector is left pending instead.
    pub fn trigger(&self, index: u32, vector: u32) -> bool {
        self.with_vector(index, vector, fire).unwrap_or(false)
    }

    /// Whether vector `vector` of type `index` has an eventfd.
    pub fn is_enabled(&self, index: u32, vector: u32) -> bool {
        self.lock()
            .get(index as usize)
            .and_then(|t| t.vectors.get(vector as usize))
            .is_some_and(|v| v.trigger.is_some())
    }

    /// Duplicates of the unmask eventfds set with UNMASK | DATA_EVENTFD,
    /// with their type and vector, for an event loop to watch.
    pub fn unmask_eventfds(&self) -> Vec<(u32, u32, EventFd)> {
        let mut out = Vec::new();
        for (index, t) in self.lock().iter().enumerate() {
            for (vector, v) in t.vectors.iter().enumerate() {
                if let Some(fd) = v.unmask.as_ref().and_then(|f| f.try_clone().ok()) {
                    out.push((index as u32, vector as u32, fd));
                }
            }
        }
        out
    }

    /// Unmasks vector `vector` of type `index` (its unmask eventfd fired),
    /// delivering what was left pending while it was masked.
    pub fn unmask(&self, index: u32, vector: u32) {
        self.with_vector(index, vector, unmask);
    }

    /// Drops every eventfd and clears masks (the client went away).
    pub fn clear(&self) {
        for t in self.lock().iter_mut() {
            for v in t.vectors.iter_mut() {
                *v = Vector::default();
            }
        }
    }

    /// Applies a SET_IRQS request. `data` is the payload after the fixed
    /// fields; `fds` are the eventfds the message carried.
    pub fn set(
        &self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        data: &[u8],
        fds: Vec<File>,
    ) -> Result<(), IrqError> {
        let data_kind = flags & DATA_MASK;
        let action = flags & ACTION_MASK;
        if flags & !(DATA_MASK | ACTION_MASK) != 0
            || data_kind.count_ones() != 1
            || action.count_ones() != 1
        {
            return Err(IrqError::Flags(flags));
        }
        let mut types = self.lock();
        let t = types
            .get_mut(index as usize)
            .filter(|t| t.info.count > 0)
            .ok_or(IrqError::Index(index))?;

        // count 0 with DATA_NONE and TRIGGER disables the whole type.
        if count == 0 {
            if data_kind == SET_DATA_NONE && action == SET_ACTION_TRIGGER && start == 0 {
                for v in t.vectors.iter_mut() {
                    *v = Vector::default();
                }
                return Ok(());
            }
            if fds.is_empty() {
                return Ok(());
            }
            return Err(IrqError::Data);
        }
        let end = start
            .checked_add(count)
            .filter(|end| *end <= t.info.count)
            .ok_or(IrqError::Range { start, count })?;
        let range = start as usize..end as usize;

        if data_kind == SET_DATA_EVENTFD {
            let slot: fn(&mut Vector) -> &mut Option<EventFd> = match action {
                SET_ACTION_TRIGGER => |v| &mut v.trigger,
                // An eventfd whose signal unmasks the vector (resampling).
                SET_ACTION_UNMASK if t.info.maskable => |v| &mut v.unmask,
                _ => return Err(IrqError::Unsupported),
            };
            let vectors = &mut t.vectors[range];
            if fds.is_empty() {
                vectors.iter_mut().for_each(|v| *slot(v) = None);
                return Ok(());
            }
            if fds.len() != count as usize {
                return Err(IrqError::Data);
            }
            for (v, f) in vectors.iter_mut().zip(fds) {
                // SAFETY: `f` is an owned fd received from the peer;
                // EventFd takes ownership of it. If it is not really an
                // eventfd, writes (TRIGGER) or reads (UNMASK) of it fail
                // and are ignored.
                *slot(v) = Some(unsafe { owned_eventfd(f) });
            }
            return Ok(());
        }
        if !fds.is_empty() {
            return Err(IrqError::Data);
        }
        // DATA_BOOL selects vectors one byte each; DATA_NONE all of them.
        // No allocation: an INTx UNMASK may follow every trapped access.
        let bools = if data_kind == SET_DATA_BOOL {
            Some(data.get(..count as usize).ok_or(IrqError::Data)?)
        } else {
            None
        };
        if matches!(action, SET_ACTION_MASK | SET_ACTION_UNMASK) && !t.info.maskable {
            return Err(IrqError::Unsupported);
        }
        let automask = t.info.automasked;
        for (i, v) in t.vectors[range].iter_mut().enumerate() {
            if bools.is_some_and(|b| b[i] == 0) {
                continue;
            }
            match action {
                SET_ACTION_MASK => v.masked = true,
                SET_ACTION_UNMASK => unmask(v, automask),
                _ => {
                    // The client raises the interrupt itself (loopback).
                    fire(v, automask);
                }
            }
        }
        Ok(())
    }
}

/// Clears the mask, delivering what was left pending while it was set.
fn unmask(v: &mut Vector, automask: bool) {
    v.masked = false;
    if std::mem::take(&mut v.pending) {
        fire(v, automask);
    }
}

fn fire(v: &mut Vector, automask: bool) -> bool {
    if v.masked {
        v.pending = true;
        return false;
    }
    let Some(fd) = &v.trigger else {
        return false;
    };
    if automask {
        v.masked = true;
    }
    // A full counter or a non-eventfd leaves the interrupt undelivered;
    // the peer chose that fd, so only its own interrupt is affected.
    fd.write(1).is_ok()
}

/// # Safety
/// `f` must be an open fd owned by the caller.
unsafe fn owned_eventfd(f: File) -> EventFd {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the caller passes ownership of an open fd.
    unsafe { EventFd::from_raw_fd(f.into_raw_fd()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{FromRawFd, IntoRawFd};

    fn irqs() -> Interrupts {
        let mut infos = [IrqInfo::default(); NUM_IRQ_TYPES as usize];
        infos[IRQ_INTX as usize] = IrqInfo {
            count: 1,
            maskable: true,
            automasked: true,
        };
        infos[IRQ_MSIX as usize] = IrqInfo {
            count: 4,
            ..Default::default()
        };
        Interrupts::new(infos)
    }

    const EVENTFD_TRIGGER: u32 = SET_DATA_EVENTFD | SET_ACTION_TRIGGER;
    const TRIGGER: u32 = SET_DATA_NONE | SET_ACTION_TRIGGER;

    fn eventfd_pair() -> (EventFd, File) {
        let efd = EventFd::new(libc::EFD_NONBLOCK).unwrap();
        let dup = efd.try_clone().unwrap();
        // SAFETY: `dup` owns a fresh fd that we hand to the File.
        let file = unsafe { File::from_raw_fd(dup.into_raw_fd()) };
        (efd, file)
    }

    /// A fresh eventfd as the trigger of vector `vector` of type `index`.
    fn trigger_eventfd(irqs: &Interrupts, index: u32, vector: u32) -> EventFd {
        let (efd, file) = eventfd_pair();
        irqs.set(index, EVENTFD_TRIGGER, vector, 1, &[], vec![file])
            .unwrap();
        efd
    }

    #[test]
    fn test_msix_eventfd_trigger_and_deassign() {
        let irqs = irqs();
        let efd = trigger_eventfd(&irqs, IRQ_MSIX, 2);
        assert!(irqs.trigger(IRQ_MSIX, 2));
        assert_eq!(efd.read().unwrap(), 1);
        assert!(!irqs.trigger(IRQ_MSIX, 1));
        assert!(!irqs.trigger(IRQ_MSIX, 99));
        irqs.set(IRQ_MSIX, EVENTFD_TRIGGER, 2, 1, &[], vec![])
            .unwrap();
        assert!(!irqs.trigger(IRQ_MSIX, 2));
    }

    #[test]
    fn test_bad_requests() {
        let irqs = irqs();
        assert_eq!(
            irqs.set(
                IRQ_MSIX,
                SET_DATA_NONE | SET_DATA_BOOL | SET_ACTION_TRIGGER,
                0,
                1,
                &[],
                vec![]
            ),
            Err(IrqError::Flags(
                SET_DATA_NONE | SET_DATA_BOOL | SET_ACTION_TRIGGER
            ))
        );
        assert_eq!(
            irqs.set(IRQ_MSIX, TRIGGER, 3, 2, &[], vec![]),
            Err(IrqError::Range { start: 3, count: 2 })
        );
        assert_eq!(
            irqs.set(IRQ_MSIX, TRIGGER, u32::MAX, 2, &[], vec![]),
            Err(IrqError::Range {
                start: u32::MAX,
                count: 2
            })
        );
        assert_eq!(
            irqs.set(1, TRIGGER, 0, 1, &[], vec![]),
            Err(IrqError::Index(1))
        );
        assert_eq!(
            irqs.set(9, TRIGGER, 0, 1, &[], vec![]),
            Err(IrqError::Index(9))
        );
        let (_e, f) = eventfd_pair();
        assert_eq!(
            irqs.set(IRQ_MSIX, EVENTFD_TRIGGER, 0, 2, &[], vec![f]),
            Err(IrqError::Data)
        );
        assert_eq!(
            irqs.set(
                IRQ_MSIX,
                SET_DATA_BOOL | SET_ACTION_TRIGGER,
                0,
                2,
                &[1],
                vec![]
            ),
            Err(IrqError::Data)
        );
        assert_eq!(
            irqs.set(IRQ_MSIX, SET_DATA_NONE | SET_ACTION_MASK, 0, 1, &[], vec![]),
            Err(IrqError::Unsupported)
        );
    }

    #[test]
    fn test_unmask_eventfd_is_kept_replaced_and_refused_where_unmaskable() {
        let irqs = irqs();
        let unmask = SET_DATA_EVENTFD | SET_ACTION_UNMASK;
        let (_a, fa) = eventfd_pair();
        irqs.set(IRQ_INTX, unmask, 0, 1, &[], vec![fa]).unwrap();
        assert_eq!(irqs.unmask_eventfds().len(), 1);
        assert_eq!(irqs.unmask_eventfds()[0].0, IRQ_INTX);
        // Two fds for one vector, or any for an unmaskable type: refused.
        let (_b, fb) = eventfd_pair();
        let (_c, fc) = eventfd_pair();
        assert_eq!(
            irqs.set(IRQ_INTX, unmask, 0, 1, &[], vec![fb, fc]),
            Err(IrqError::Data)
        );
        let (_d, fd) = eventfd_pair();
        assert_eq!(
            irqs.set(IRQ_MSIX, unmask, 0, 1, &[], vec![fd]),
            Err(IrqError::Unsupported)
        );
        // No fds removes it; so does the client going away.
        irqs.set(IRQ_INTX, unmask, 0, 1, &[], vec![]).unwrap();
        assert!(irqs.unmask_eventfds().is_empty());
        let (_e, fe) = eventfd_pair();
        irqs.set(IRQ_INTX, unmask, 0, 1, &[], vec![fe]).unwrap();
        irqs.clear();
        assert!(irqs.unmask_eventfds().is_empty());
    }

    #[test]
    fn test_intx_automask_pending_unmask() {
        // SET_IRQS UNMASK and the unmask eventfd (`unmask`) alike deliver
        // what was left pending.
        let by_set_irqs = |irqs: &Interrupts| {
            let flags = SET_DATA_NONE | SET_ACTION_UNMASK;
            irqs.set(IRQ_INTX, flags, 0, 1, &[], vec![]).unwrap()
        };
        let by_eventfd = |irqs: &Interrupts| irqs.unmask(IRQ_INTX, 0);
        let unmasks: [&dyn Fn(&Interrupts); 2] = [&by_set_irqs, &by_eventfd];
        for unmask in unmasks {
            let irqs = irqs();
            let efd = trigger_eventfd(&irqs, IRQ_INTX, 0);
            assert!(irqs.trigger(IRQ_INTX, 0));
            // Automasked now: the next one stays pending.
            assert!(!irqs.trigger(IRQ_INTX, 0));
            assert_eq!(efd.read().unwrap(), 1);
            unmask(&irqs);
            assert_eq!(efd.read().unwrap(), 1);
            // Out-of-range vectors and types are ignored.
            irqs.unmask(IRQ_INTX, 7);
            irqs.unmask(99, 0);
        }
    }

    #[test]
    fn test_disable_all_and_bool_trigger() {
        let irqs = irqs();
        let efd = trigger_eventfd(&irqs, IRQ_MSIX, 1);
        irqs.set(
            IRQ_MSIX,
            SET_DATA_BOOL | SET_ACTION_TRIGGER,
            0,
            2,
            &[0, 1],
            vec![],
        )
        .unwrap();
        assert_eq!(efd.read().unwrap(), 1);
        irqs.set(IRQ_MSIX, TRIGGER, 0, 0, &[], vec![]).unwrap();
        assert!(!irqs.is_enabled(IRQ_MSIX, 1));
    }
}
