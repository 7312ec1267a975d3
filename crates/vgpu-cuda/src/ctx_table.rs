//! Contexts, each behind a handle, and the primary context of each
//! device: the table of them that [`crate::objects::Objects`] holds.

use std::collections::HashMap;

use crate::cu::{self, CUdevice, CuResult};
use crate::handles::Handles;

/// A context: CUDA's per-device address space and state.
pub struct Ctx {
    /// The device it is a context of.
    device: CUdevice,
    /// Values stored through the context-local-storage table, with the
    /// destructor to call when the context is reset.
    storage: Storage,
    /// `CUlimit` values, by limit number.
    limits: [usize; 10],
    /// The `CUctx_flags` it was created with.
    flags: u32,
}

/// Values stored through the context-local-storage table, by key, with
/// the destructor of each.
pub type Storage = HashMap<usize, (usize, Option<cu::ClsDtor>)>;

/// CUDA's defaults for `CUlimit` 0..=9: stack, printf FIFO, malloc heap,
/// sync depth, pending launches, L2 fetch granularity, persisting L2,
/// then the three of contexts shared with graphics (CIG), which a vGPU's
/// never are: shared memory, enabled, fallback.
pub const DEFAULT_LIMITS: [usize; 10] = [1024, 1 << 20, 8 << 20, 2, 2048, 32, 0, 0, 0, 0];

/// `CU_LIMIT_SHMEM_SIZE` and `CU_LIMIT_CIG_ENABLED` can only be queried.
pub const READ_ONLY_LIMITS: [u32; 2] = [7, 8];

impl Ctx {
    /// A context of `device` with `flags`, CUDA's default limits and no
    /// stored values.
    pub fn new(device: CUdevice, flags: u32) -> Ctx {
        Ctx {
            device,
            storage: HashMap::new(),
            limits: DEFAULT_LIMITS,
            flags,
        }
    }

    /// The device it is a context of.
    pub fn device(&self) -> CUdevice {
        self.device
    }

    /// Its `CUctx_flags`.
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// Sets its `CUctx_flags` (`cuCtxSetFlags`).
    pub fn set_flags(&mut self, flags: u32) {
        self.flags = flags;
    }

    /// `CUlimit` `limit`'s value; an unknown limit is an invalid value.
    pub fn limit(&self, limit: u32) -> CuResult<usize> {
        Ok(*self
            .limits
            .get(limit as usize)
            .ok_or(cu::ERROR_INVALID_VALUE)?)
    }

    /// Sets `CUlimit` `limit`; an unknown limit is an invalid value.
    pub fn set_limit(&mut self, limit: u32, value: usize) -> CuResult {
        *self
            .limits
            .get_mut(limit as usize)
            .ok_or(cu::ERROR_INVALID_VALUE)? = value;
        Ok(())
    }

    /// Stores `value` under `key`, with the destructor to call on reset.
    pub fn store(&mut self, key: usize, value: usize, dtor: Option<cu::ClsDtor>) {
        self.storage.insert(key, (value, dtor));
    }

    /// Forgets the value stored under `key`.
    pub fn unstore(&mut self, key: usize) {
        self.storage.remove(&key);
    }

    /// The value stored under `key`; none is an invalid handle.
    pub fn stored(&self, key: usize) -> CuResult<usize> {
        Ok(self.storage.get(&key).ok_or(cu::ERROR_INVALID_HANDLE)?.0)
    }

    /// Takes every stored value, with its destructor, out of the context.
    pub fn take_storage(&mut self) -> Storage {
        std::mem::take(&mut self.storage)
    }
}

/// The contexts, primary ones included, and each device's primary
/// context's reference count and flags.
#[derive(Default)]
pub struct Contexts {
    /// Contexts by handle; CUDA calls an unknown one an invalid context.
    pub ctxs: Handles<Ctx, { cu::ERROR_INVALID_CONTEXT }>,
    /// Primary context reference counts, per device.
    primary_refs: Vec<u32>,
    /// Primary context flags, per device (`cuDevicePrimaryCtxSetFlags`).
    primary_flags: Vec<u32>,
}

impl Contexts {
    /// Starts `devices` primary contexts unreferenced, with no flags.
    pub fn set_devices(&mut self, devices: usize) {
        self.primary_refs = vec![0; devices];
        self.primary_flags = vec![0; devices];
    }

    /// Takes a reference to device `dev`'s primary context.
    pub fn retain_primary(&mut self, dev: CUdevice) {
        self.primary_refs[dev as usize] += 1;
    }

    /// Lets a reference to device `dev`'s primary context go; none held
    /// is an invalid context.
    pub fn release_primary(&mut self, dev: CUdevice) -> CuResult {
        let refs = &mut self.primary_refs[dev as usize];
        *refs = refs.checked_sub(1).ok_or(cu::ERROR_INVALID_CONTEXT)?;
        Ok(())
    }

    /// Lets every reference to device `dev`'s primary context go.
    pub fn reset_primary(&mut self, dev: CUdevice) {
        self.primary_refs[dev as usize] = 0;
    }

    /// Device `dev`'s primary context's flags, and whether it is active
    /// (referenced).
    pub fn primary_state(&self, dev: CUdevice) -> (u32, bool) {
        (
            self.primary_flags[dev as usize],
            self.primary_refs[dev as usize] > 0,
        )
    }

    /// Sets device `dev`'s primary context's flags.
    pub fn set_primary_flags(&mut self, dev: CUdevice, flags: u32) {
        self.primary_flags[dev as usize] = flags;
    }
}
