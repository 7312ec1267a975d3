//! The C interface, declared in `include/vgpu_guest.h`.
//!
//! Every function returns 0 or a negative errno. Panics never cross the
//! boundary (each body runs under `catch_unwind` and a panic becomes
//! `-EIO`), and every pointer argument is checked for NULL.

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use vgpu_sys::lock;

use crate::{Batch, Buffer, Device, Dims, Error, Pending};

/// `struct vgpu_device_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VgpuDeviceInfo {
    /// Device ABI: `major << 16 | minor`.
    pub abi_version: u32,
    /// PCI vendor id.
    pub vendor_id: u16,
    /// PCI device id.
    pub device_id: u16,
    /// Compute units of the partition.
    pub compute_units: u32,
    /// N of `/dev/vgpuN`.
    pub minor: u32,
    /// Device FEATURES register.
    pub features: u64,
    /// Device memory of the partition, bytes.
    pub mem_size: u64,
    /// Device memory in use, bytes.
    pub mem_used: u64,
    /// Host-visible window, bytes.
    pub window_size: u64,
}

/// Launches kept in flight before `vgpu_launch` collects the oldest.
const MAX_IN_FLIGHT: usize = 256;

/// `vgpu_device`: an open device with the allocations and launches made
/// through the C interface.
pub struct VgpuHandle {
    dev: Device,
    buffers: Mutex<HashMap<u64, Buffer>>,
    launches: Mutex<Launches>,
}

#[derive(Default)]
struct Launches {
    pending: VecDeque<Pending>,
    /// First error of a collected launch, not yet reported.
    error: c_int,
}

fn neg(e: &Error) -> c_int {
    -e.errno()
}

/// 0 or the negative errno of `r`.
fn status(r: crate::Result<()>) -> c_int {
    r.map_or_else(|e| neg(&e), |()| 0)
}

/// Runs `f`; a panic becomes `-EIO`.
fn guard(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(-libc::EIO)
}

/// Runs `f` on the handle under [`guard`]; a NULL handle is `-EINVAL`.
fn with_handle(h: Option<&VgpuHandle>, f: impl FnOnce(&VgpuHandle) -> c_int) -> c_int {
    guard(|| h.map_or(-libc::EINVAL, f))
}

/// A copy of `size` bytes through the user pointer `user`: nothing to do
/// for 0 bytes, `-EINVAL` for NULL, else what `copy` returns.
fn user_copy(user: *const c_void, size: usize, copy: impl FnOnce() -> crate::Result<()>) -> c_int {
    if size == 0 {
        return 0;
    }
    if user.is_null() {
        return -libc::EINVAL;
    }
    status(copy())
}

impl Launches {
    /// Waits for the oldest launch; keeps its error if it is the first.
    fn collect_one(&mut self) {
        let Some(mut p) = self.pending.pop_front() else {
            return;
        };
        let r = loop {
            match p.wait(None) {
                Err(Error::Interrupted) => continue,
                r => break r.and_then(|done| done.check()),
            }
        };
        if let Err(e) = r {
            if self.error == 0 {
                self.error = neg(&e);
            }
        }
    }
}

/// The handle behind a pointer from `vgpu_open`.
///
/// # Safety
///
/// `dev` is NULL or a live handle from `vgpu_open`.
unsafe fn handle<'a>(dev: *mut VgpuHandle) -> Option<&'a VgpuHandle> {
    // SAFETY: the caller's contract: NULL or a pointer from Box::into_raw
    // that vgpu_close has not freed.
    unsafe { dev.as_ref() }
}

/// Opens a device (`path` NULL: `/dev/vgpu0`) into `*dev`.
///
/// # Safety
///
/// `path` is NULL or a NUL-terminated string; `dev` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vgpu_open(path: *const c_char, dev: *mut *mut VgpuHandle) -> c_int {
    guard(|| {
        if dev.is_null() {
            return -libc::EINVAL;
        }
        let path = if path.is_null() {
            "/dev/vgpu0".to_string()
        } else {
            // SAFETY: the caller's contract: a NUL-terminated string.
            match unsafe { CStr::from_ptr(path) }.to_str() {
                Ok(p) => p.to_string(),
                Err(_) => return -libc::EINVAL,
            }
        };
        match Device::open(&path) {
            Ok(d) => {
                let h = Box::new(VgpuHandle {
                    dev: d,
                    buffers: Mutex::new(HashMap::new()),
                    launches: Mutex::new(Launches::default()),
                });
                // SAFETY: `dev` is non-NULL and writable (caller's contract).
                unsafe { dev.write(Box::into_raw(h)) };
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// Closes a handle; NULL is ignored.
///
/// # Safety
///
/// `dev` is NULL or a live handle, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn vgpu_close(dev: *mut VgpuHandle) {
    guard(|| {
        if !dev.is_null() {
            // SAFETY: a pointer from Box::into_raw in vgpu_open, given
            // back exactly once (caller's contract).
            let h = unsafe { Box::from_raw(dev) };
            // Launches first (waited for), then buffers, then the file.
            drop(std::mem::take(&mut *lock(&h.launches)));
            drop(std::mem::take(&mut *lock(&h.buffers)));
            drop(h);
        }
        0
    });
}

/// Fills `*info`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `info` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vgpu_info(dev: *mut VgpuHandle, info: *mut VgpuDeviceInfo) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        if info.is_null() {
            return -libc::EINVAL;
        }
        let i = match h.dev.info() {
            Ok(i) => i,
            Err(e) => return neg(&e),
        };
        let mem_used = match h.dev.usage() {
            Ok(u) => u.mem_used,
            Err(e) => return neg(&e),
        };
        let out = VgpuDeviceInfo {
            abi_version: i.abi_version,
            vendor_id: i.vendor_id,
            device_id: i.device_id,
            compute_units: i.compute_units,
            minor: i.minor,
            features: i.features,
            mem_size: i.mem_size,
            mem_used,
            window_size: i.window_size,
        };
        // SAFETY: non-NULL and writable (caller's contract).
        unsafe { info.write(out) };
        0
    })
}

/// Allocates `size` bytes; the device address goes to `*addr`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `addr` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vgpu_alloc(dev: *mut VgpuHandle, size: u64, addr: *mut u64) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        if addr.is_null() {
            return -libc::EINVAL;
        }
        match h.dev.alloc(size) {
            Ok(b) => {
                let a = b.addr();
                lock(&h.buffers).insert(a, b);
                // SAFETY: non-NULL and writable (caller's contract).
                unsafe { addr.write(a) };
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// Frees an allocation.
///
/// # Safety
///
/// `dev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vgpu_free(dev: *mut VgpuHandle, addr: u64) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        let buf = lock(&h.buffers).remove(&addr);
        let r = match buf {
            Some(b) => b.free(),
            None => h.dev.free_raw(addr),
        };
        status(r)
    })
}

/// Copies `size` bytes from `src` to device address `dst`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `src` is NULL or readable for `size`
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn vgpu_copy_to_device(
    dev: *mut VgpuHandle,
    dst: u64,
    src: *const c_void,
    size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        user_copy(src, size, || {
            // SAFETY: non-NULL and readable for `size` bytes (caller's
            // contract), and not written while this call runs.
            let data = unsafe { std::slice::from_raw_parts(src as *const u8, size) };
            h.dev.copy_to_device_addr(dst, data)
        })
    })
}

/// Copies `size` bytes from device address `src` to `dst`.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `dst` is NULL or writable for `size`
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn vgpu_copy_from_device(
    dev: *mut VgpuHandle,
    dst: *mut c_void,
    src: u64,
    size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        user_copy(dst, size, || {
            // SAFETY: non-NULL and writable for `size` bytes (caller's
            // contract), and not otherwise accessed while this call runs.
            let out = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, size) };
            h.dev.copy_from_device_addr(src, out)
        })
    })
}

/// Launches a built-in kernel without waiting.
///
/// # Safety
///
/// `dev` is NULL or a live handle; `entry` is NULL or a NUL-terminated
/// string; `params` is NULL or readable for `params_size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vgpu_launch(
    dev: *mut VgpuHandle,
    entry: *const c_char,
    params: *const c_void,
    params_size: usize,
) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        if entry.is_null() || (params.is_null() && params_size != 0) {
            return -libc::EINVAL;
        }
        // SAFETY: non-NULL and NUL-terminated (caller's contract).
        let Ok(entry) = (unsafe { CStr::from_ptr(entry) }).to_str() else {
            return -libc::EINVAL;
        };
        if params_size > crate::sys::MAX_PARAMS_BYTES as usize {
            return -libc::E2BIG;
        }
        let bytes: &[u8] = if params_size == 0 {
            &[]
        } else {
            // SAFETY: non-NULL and readable for `params_size` bytes
            // (caller's contract); copied into the batch right away.
            unsafe { std::slice::from_raw_parts(params as *const u8, params_size) }
        };
        let mut batch = Batch::new();
        batch.launch_builtin_bytes(entry, Dims::default(), bytes);
        let mut l = lock(&h.launches);
        while l.pending.len() >= MAX_IN_FLIGHT {
            l.collect_one();
        }
        match h.dev.submit(batch) {
            Ok(p) => {
                l.pending.push_back(p);
                0
            }
            Err(e) => neg(&e),
        }
    })
}

/// Waits for every launch; returns the first error since the last call.
///
/// # Safety
///
/// `dev` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn vgpu_synchronize(dev: *mut VgpuHandle) -> c_int {
    // SAFETY: the caller's contract.
    with_handle(unsafe { handle(dev) }, |h| {
        let mut l = lock(&h.launches);
        while !l.pending.is_empty() {
            l.collect_one();
        }
        std::mem::take(&mut l.error)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::path::PathBuf;
    use std::process::Command;

    fn include_dir() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("include")
    }

    /// The header compiles cleanly, as C and as C++, and its structure has
    /// the Rust layout.
    #[test]
    fn test_header_matches_rust() {
        let fields = [
            ("abi_version", offset_of!(VgpuDeviceInfo, abi_version)),
            ("vendor_id", offset_of!(VgpuDeviceInfo, vendor_id)),
            ("device_id", offset_of!(VgpuDeviceInfo, device_id)),
            ("compute_units", offset_of!(VgpuDeviceInfo, compute_units)),
            ("minor", offset_of!(VgpuDeviceInfo, minor)),
            ("features", offset_of!(VgpuDeviceInfo, features)),
            ("mem_size", offset_of!(VgpuDeviceInfo, mem_size)),
            ("mem_used", offset_of!(VgpuDeviceInfo, mem_used)),
            ("window_size", offset_of!(VgpuDeviceInfo, window_size)),
        ];
        let mut src = String::from(
            "#include <stddef.h>\n#include \"vgpu_guest.h\"\n\
             #define CHECK(c, m) _Static_assert(c, m);\n",
        );
        src.push_str(&format!(
            "CHECK(sizeof(struct vgpu_device_info) == {}, \"size\")\n",
            size_of::<VgpuDeviceInfo>()
        ));
        for (f, off) in fields {
            src.push_str(&format!(
                "CHECK(offsetof(struct vgpu_device_info, {f}) == {off}, \"{f}\")\n"
            ));
        }
        // The prototypes, as the Rust functions define them.
        src.push_str(
            "static int (*p_open)(const char *, vgpu_device **) = vgpu_open;\n\
             static void (*p_close)(vgpu_device *) = vgpu_close;\n\
             static int (*p_info)(vgpu_device *, struct vgpu_device_info *) = vgpu_info;\n\
             static int (*p_alloc)(vgpu_device *, uint64_t, uint64_t *) = vgpu_alloc;\n\
             static int (*p_free)(vgpu_device *, uint64_t) = vgpu_free;\n\
             static int (*p_to)(vgpu_device *, uint64_t, const void *, size_t) = vgpu_copy_to_device;\n\
             static int (*p_from)(vgpu_device *, void *, uint64_t, size_t) = vgpu_copy_from_device;\n\
             static int (*p_launch)(vgpu_device *, const char *, const void *, size_t) = vgpu_launch;\n\
             static int (*p_sync)(vgpu_device *) = vgpu_synchronize;\n\
             void *all[] = { &p_open, &p_close, &p_info, &p_alloc, &p_free, &p_to, &p_from, &p_launch, &p_sync };\n",
        );
        let dir = std::env::temp_dir().join(format!("vgpu-guest-h-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (lang, file, std) in [("c", "t.c", "-std=c11"), ("c++", "t.cc", "-std=c++17")] {
            let path = dir.join(file);
            let text = if lang == "c++" {
                src.replace("_Static_assert", "static_assert")
            } else {
                src.clone()
            };
            std::fs::write(&path, text).unwrap();
            crate::compile_c(
                Command::new("gcc")
                    .args([
                        "-x",
                        lang,
                        std,
                        "-fsyntax-only",
                        "-Wall",
                        "-Wextra",
                        "-Werror",
                    ])
                    .arg("-I")
                    .arg(include_dir())
                    .arg(&path),
                lang,
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn test_null_pointers_are_refused() {
        // SAFETY: NULL handles and pointers are part of the contract.
        unsafe {
            assert_eq!(
                vgpu_open(std::ptr::null(), std::ptr::null_mut()),
                -libc::EINVAL
            );
            vgpu_close(std::ptr::null_mut());
            let null = std::ptr::null_mut();
            assert_eq!(vgpu_info(null, std::ptr::null_mut()), -libc::EINVAL);
            let mut a = 0u64;
            assert_eq!(vgpu_alloc(null, 16, &mut a), -libc::EINVAL);
            assert_eq!(vgpu_free(null, 0), -libc::EINVAL);
            assert_eq!(
                vgpu_copy_to_device(null, 0, std::ptr::null(), 4),
                -libc::EINVAL
            );
            assert_eq!(
                vgpu_copy_from_device(null, std::ptr::null_mut(), 0, 4),
                -libc::EINVAL
            );
            assert_eq!(
                vgpu_launch(null, std::ptr::null(), std::ptr::null(), 0),
                -libc::EINVAL
            );
            assert_eq!(vgpu_synchronize(null), -libc::EINVAL);
        }
    }

    #[test]
    fn test_open_errors_are_negative_errnos() {
        let mut dev = std::ptr::null_mut();
        // SAFETY: valid NUL-terminated strings and a writable out pointer.
        unsafe {
            assert_eq!(
                vgpu_open(c"/nonexistent/vgpu0".as_ptr(), &mut dev),
                -libc::ENOENT
            );
            assert_eq!(vgpu_open(c"/dev/null".as_ptr(), &mut dev), -libc::ENOTTY);
        }
        assert!(dev.is_null());
    }

    #[test]
    fn test_panics_do_not_escape() {
        assert_eq!(guard(|| panic!("boom")), -libc::EIO);
    }
}
