//! A table of objects filed by handle, which answers a handle it does not
//! hold with CUDA's error for it (an invalid handle, or for contexts an
//! invalid context), so no caller reaches into a map.

use std::collections::HashMap;

use crate::cu::{self, CUresult, CuResult};

/// Objects of one kind by handle; `BAD` is the error for a handle that
/// is not among them.
pub struct Handles<T, const BAD: CUresult = { cu::ERROR_INVALID_HANDLE }> {
    map: HashMap<usize, T>,
}

impl<T, const BAD: CUresult> Default for Handles<T, BAD> {
    fn default() -> Self {
        Handles {
            map: HashMap::new(),
        }
    }
}

impl<T, const BAD: CUresult> Handles<T, BAD> {
    /// The object filed under `h`.
    pub fn get(&self, h: usize) -> CuResult<&T> {
        self.map.get(&h).ok_or(BAD)
    }

    /// The object filed under `h`, to change.
    pub fn get_mut(&mut self, h: usize) -> CuResult<&mut T> {
        self.map.get_mut(&h).ok_or(BAD)
    }

    /// Whether an object is filed under `h`.
    pub fn contains(&self, h: usize) -> bool {
        self.map.contains_key(&h)
    }

    /// Files `value` under `h` (a fresh handle).
    pub fn insert(&mut self, h: usize, value: T) {
        self.map.insert(h, value);
    }

    /// Takes the object filed under `h` out of the table.
    pub fn remove(&mut self, h: usize) -> CuResult<T> {
        self.map.remove(&h).ok_or(BAD)
    }

    /// Keeps only the objects `keep` says yes to.
    pub fn retain(&mut self, mut keep: impl FnMut(usize, &mut T) -> bool) {
        self.map.retain(|&h, v| keep(h, v));
    }

    /// Every object, with its handle, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &T)> {
        self.map.iter().map(|(&h, v)| (h, v))
    }

    /// The object filed under `h`, which the caller knows is there.
    pub fn at(&self, h: usize) -> &T {
        &self.map[&h]
    }

    /// Every object, to change, in no particular order.
    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.map.values_mut()
    }
}
