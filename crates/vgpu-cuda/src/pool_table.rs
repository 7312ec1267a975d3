//! Memory pools (`cudaMallocAsync`'s `CUmemoryPool`s): each device's
//! default pool, pools a program creates, and which one a device's
//! stream-ordered allocations come from. Allocations are the device's
//! ordinary ones; a pool keeps no memory aside when they are freed (its
//! release threshold is kept and reported, and there is nothing to
//! trim), so what it reports reserved is what is in use.

use std::collections::HashMap;

use crate::cu::CuResult;
use crate::cu::{self, CUdevice};

/// `CUmemPool_attribute`.
pub const ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES: i32 = 1;
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC`.
pub const ATTR_REUSE_ALLOW_OPPORTUNISTIC: i32 = 2;
/// `CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES`.
pub const ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: i32 = 3;
/// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`.
pub const ATTR_RELEASE_THRESHOLD: i32 = 4;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`.
pub const ATTR_RESERVED_MEM_CURRENT: i32 = 5;
/// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`.
pub const ATTR_RESERVED_MEM_HIGH: i32 = 6;
/// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT`.
pub const ATTR_USED_MEM_CURRENT: i32 = 7;
/// `CU_MEMPOOL_ATTR_USED_MEM_HIGH`.
pub const ATTR_USED_MEM_HIGH: i32 = 8;

/// An attribute's value: the three reuse flags are `int`s, the rest
/// `cuuint64_t`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value {
    /// An `int` attribute.
    Int(i32),
    /// A `cuuint64_t` attribute.
    U64(u64),
}

/// One pool.
#[derive(Debug)]
pub struct Pool {
    /// The device whose memory it hands out.
    pub device: CUdevice,
    /// The three reuse flags, as set (all on, as CUDA starts them).
    reuse: [i32; 3],
    release_threshold: u64,
    used: u64,
    used_high: u64,
    /// Destroyed while allocations from it were live: it goes with the
    /// last of them.
    destroyed: bool,
}

impl Pool {
    fn new(device: CUdevice) -> Pool {
        Pool {
            device,
            reuse: [1, 1, 1],
            release_threshold: 0,
            used: 0,
            used_high: 0,
            destroyed: false,
        }
    }
}

/// Every pool, each device's default and current one, and the pool of
/// each live stream-ordered allocation.
#[derive(Debug, Default)]
pub struct Pools {
    pools: HashMap<usize, Pool>,
    /// Device → (default pool, current pool).
    devices: HashMap<CUdevice, (usize, usize)>,
    /// Allocation start → (its pool, its size).
    allocs: HashMap<u64, (usize, u64)>,
}

impl Pools {
    /// Device `dev`'s (default, current) pools; the default one is made
    /// with `handle` on first use.
    fn device(&mut self, dev: CUdevice, handle: impl FnOnce() -> usize) -> (usize, usize) {
        if let Some(&p) = self.devices.get(&dev) {
            return p;
        }
        let h = handle();
        self.pools.insert(h, Pool::new(dev));
        self.devices.insert(dev, (h, h));
        (h, h)
    }

    /// Device `dev`'s default pool.
    pub fn default_pool(&mut self, dev: CUdevice, handle: impl FnOnce() -> usize) -> usize {
        self.device(dev, handle).0
    }

    /// The pool device `dev`'s `cuMemAllocAsync` allocates from.
    pub fn current(&mut self, dev: CUdevice, handle: impl FnOnce() -> usize) -> usize {
        self.device(dev, handle).1
    }

    /// Makes `pool` (of device `dev`) the one its `cuMemAllocAsync` uses.
    pub fn set_current(
        &mut self,
        dev: CUdevice,
        pool: usize,
        handle: impl FnOnce() -> usize,
    ) -> CuResult {
        match self.pools.get(&pool) {
            Some(p) if p.device == dev && !p.destroyed => {}
            _ => return Err(cu::ERROR_INVALID_VALUE),
        }
        let (default, _) = self.device(dev, handle);
        self.devices.insert(dev, (default, pool));
        Ok(())
    }

    /// A new pool of device `dev`, filed as `handle`.
    pub fn create(&mut self, dev: CUdevice, handle: usize) {
        self.pools.insert(handle, Pool::new(dev));
    }

    /// The live pool `pool`.
    pub fn get(&self, pool: usize) -> CuResult<&Pool> {
        self.pools
            .get(&pool)
            .filter(|p| !p.destroyed)
            .ok_or(cu::ERROR_INVALID_VALUE)
    }

    /// Destroys `pool` (not a default one); its live allocations stay
    /// valid, and it goes with the last of them. A device whose current
    /// pool it was goes back to its default.
    pub fn destroy(&mut self, pool: usize) -> CuResult {
        self.get(pool)?;
        if self.devices.values().any(|&(d, _)| d == pool) {
            return Err(cu::ERROR_INVALID_VALUE);
        }
        for (default, current) in self.devices.values_mut() {
            if *current == pool {
                *current = *default;
            }
        }
        let p = self.pools.get_mut(&pool).expect("checked above");
        if p.used == 0 {
            self.pools.remove(&pool);
        } else {
            p.destroyed = true;
        }
        Ok(())
    }

    /// Records allocation `[addr, addr + size)` as `pool`'s.
    pub fn allocated(&mut self, pool: usize, addr: u64, size: u64) {
        if let Some(p) = self.pools.get_mut(&pool) {
            p.used += size;
            p.used_high = p.used_high.max(p.used);
            self.allocs.insert(addr, (pool, size));
        }
    }

    /// Forgets allocation `addr`, if a pool's.
    pub fn freed(&mut self, addr: u64) {
        let Some((pool, size)) = self.allocs.remove(&addr) else {
            return;
        };
        if let Some(p) = self.pools.get_mut(&pool) {
            p.used = p.used.saturating_sub(size);
            if p.destroyed && p.used == 0 {
                self.pools.remove(&pool);
            }
        }
    }

    /// The pool allocation `addr` came from, if one did.
    pub fn pool_of(&self, addr: u64) -> Option<usize> {
        self.allocs.get(&addr).map(|&(p, _)| p)
    }

    /// Attribute `attr` of `pool`.
    pub fn attribute(&self, pool: usize, attr: i32) -> CuResult<Value> {
        let p = self.get(pool)?;
        Ok(match attr {
            ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES => {
                Value::Int(p.reuse[(attr - 1) as usize])
            }
            ATTR_RELEASE_THRESHOLD => Value::U64(p.release_threshold),
            // Nothing is kept aside: reserved is what is in use.
            ATTR_RESERVED_MEM_CURRENT | ATTR_USED_MEM_CURRENT => Value::U64(p.used),
            ATTR_RESERVED_MEM_HIGH | ATTR_USED_MEM_HIGH => Value::U64(p.used_high),
            _ => return Err(cu::ERROR_INVALID_VALUE),
        })
    }

    /// Sets attribute `attr` of `pool`: the reuse flags, the release
    /// threshold, and the high-water marks (to 0 only, which resets them
    /// to what is in use now).
    pub fn set_attribute(&mut self, pool: usize, attr: i32, v: Value) -> CuResult {
        self.get(pool)?;
        let p = self.pools.get_mut(&pool).expect("checked above");
        match (attr, v) {
            (
                ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                Value::Int(x),
            ) => {
                p.reuse[(attr - 1) as usize] = i32::from(x != 0);
            }
            (ATTR_RELEASE_THRESHOLD, Value::U64(x)) => p.release_threshold = x,
            (ATTR_RESERVED_MEM_HIGH | ATTR_USED_MEM_HIGH, Value::U64(0)) => p.used_high = p.used,
            _ => return Err(cu::ERROR_INVALID_VALUE),
        }
        Ok(())
    }
}

/// Whether attribute `attr` is one of the `int` ones.
pub fn is_int(attr: i32) -> bool {
    (ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES..=ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES).contains(&attr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handles() -> impl FnMut() -> usize {
        let mut n = 0x100;
        move || {
            n += 0x10;
            n
        }
    }

    #[test]
    fn a_device_has_one_default_pool_until_another_is_set() {
        let mut p = Pools::default();
        let mut h = handles();
        let d = p.default_pool(0, &mut h);
        assert_eq!(p.default_pool(0, &mut h), d);
        assert_eq!(p.current(0, &mut h), d);
        let other = h();
        p.create(0, other);
        p.set_current(0, other, &mut h).unwrap();
        assert_eq!(p.current(0, &mut h), other);
        assert_eq!(p.default_pool(0, &mut h), d);
        // Not a pool of device 1; not a pool at all.
        assert_eq!(
            p.set_current(1, other, &mut h),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(
            p.set_current(0, 12345, &mut h),
            Err(cu::ERROR_INVALID_VALUE)
        );
        // The default pool is not destroyed; the current one goes back to
        // the default when it is.
        assert_eq!(p.destroy(d), Err(cu::ERROR_INVALID_VALUE));
        p.destroy(other).unwrap();
        assert_eq!(p.current(0, &mut h), d);
        assert!(p.get(other).is_err());
    }

    #[test]
    fn usage_follows_allocations_and_a_destroyed_pool_waits_for_its_last() {
        let mut p = Pools::default();
        let mut h = handles();
        let pool = h();
        p.create(0, pool);
        p.allocated(pool, 0x1000, 100);
        p.allocated(pool, 0x2000, 50);
        assert_eq!(
            p.attribute(pool, ATTR_USED_MEM_CURRENT),
            Ok(Value::U64(150))
        );
        p.freed(0x1000);
        assert_eq!(
            p.attribute(pool, ATTR_RESERVED_MEM_CURRENT),
            Ok(Value::U64(50))
        );
        assert_eq!(p.attribute(pool, ATTR_USED_MEM_HIGH), Ok(Value::U64(150)));
        // The high-water mark resets to what is in use, and only by 0.
        assert_eq!(
            p.set_attribute(pool, ATTR_USED_MEM_HIGH, Value::U64(7)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        p.set_attribute(pool, ATTR_USED_MEM_HIGH, Value::U64(0))
            .unwrap();
        assert_eq!(p.attribute(pool, ATTR_USED_MEM_HIGH), Ok(Value::U64(50)));
        assert_eq!(p.pool_of(0x2000), Some(pool));
        p.destroy(pool).unwrap();
        assert!(p.get(pool).is_err());
        assert!(p.pools.contains_key(&pool), "kept for its live allocation");
        p.freed(0x2000);
        assert!(!p.pools.contains_key(&pool));
        // Freeing what no pool gave is nothing.
        p.freed(0x9999);
    }

    #[test]
    fn attributes_keep_what_is_set() {
        let mut p = Pools::default();
        let pool = p.default_pool(0, handles());
        assert_eq!(
            p.attribute(pool, ATTR_REUSE_ALLOW_OPPORTUNISTIC),
            Ok(Value::Int(1))
        );
        p.set_attribute(pool, ATTR_REUSE_ALLOW_OPPORTUNISTIC, Value::Int(0))
            .unwrap();
        assert_eq!(
            p.attribute(pool, ATTR_REUSE_ALLOW_OPPORTUNISTIC),
            Ok(Value::Int(0))
        );
        p.set_attribute(pool, ATTR_RELEASE_THRESHOLD, Value::U64(u64::MAX))
            .unwrap();
        assert_eq!(
            p.attribute(pool, ATTR_RELEASE_THRESHOLD),
            Ok(Value::U64(u64::MAX))
        );
        assert_eq!(
            p.set_attribute(pool, ATTR_USED_MEM_CURRENT, Value::U64(0)),
            Err(cu::ERROR_INVALID_VALUE)
        );
        assert_eq!(p.attribute(pool, 99), Err(cu::ERROR_INVALID_VALUE));
        assert!(is_int(1) && is_int(3) && !is_int(4));
    }
}
