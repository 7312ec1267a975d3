//! `cuGetExportTable`: the private tables the CUDA runtime (static and
//! shared) asks its driver for at initialisation. They are undocumented;
//! what each slot does is what other drivers for the same runtime found
//! (ZLUDA, LUPINE). Slot 0 of most tables holds the table's size in
//! bytes; empty slots are null, which the runtime tolerates.

use std::cell::UnsafeCell;
use std::ffi::c_void;

use crate::cu::{self, CUresult, CUuuid, Handle};
use crate::ffi::{self, entry};
use crate::images::load;
use crate::state::{self, driver};

/// A table: an array of words, as the runtime reads it.
#[repr(transparent)]
pub struct Table<const N: usize>([*const c_void; N]);

// SAFETY: the tables are immutable after compilation; the pointers are
// function addresses and sizes, never written through.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn ptr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

const fn size_of_table(n: usize) -> *const c_void {
    (n * std::mem::size_of::<usize>()) as *const c_void
}

const NULL: *const c_void = std::ptr::null();

/// A table id, written as the runtime's UUID reads byte by byte.
const fn uuid(id: u128) -> CUuuid {
    CUuuid {
        bytes: id.to_be_bytes(),
    }
}

const CUDART_INTERFACE_ID: CUuuid = uuid(0x6bd5fb6c5bf4e74a8987d93912fd9df9);
const TOOLS_TLS_ID: CUuuid = uuid(0x42d85a8123f6cb478298f6e78a3aecdc);
const TOOLS_RUNTIME_CALLBACK_HOOKS_ID: CUuuid = uuid(0xa094798c2e742e7493f20800200c0a66);
const CONTEXT_LOCAL_STORAGE_ID: CUuuid = uuid(0xc693336e1121df11a8c368f355d89593);
const INTEGRITY_CHECK_ID: CUuuid = uuid(0xd4082055bde6704b8d34ba123c66e1f2);
const CONTEXT_CHECKS_ID: CUuuid = uuid(0x263e88607cd2614392f6bbd5006dfa7e);
/// Asked for by cuBLAS and cuFFT at their start.
const CONTEXT_QUERY_ID: CUuuid = uuid(0x21318c60971432488ca641ff7324c8f2);
/// Asked for by cuFFT after it loads its modules.
const MODULE_QUERY_ID: CUuuid = uuid(0x6e163fbeb958444d835ce182aff1991e);
/// Asked for by cuBLASLt when it starts.
const KERNEL_SESSION_ID: CUuuid = uuid(0x1734dc26800d47458726c0f1e7dd8bca);

static CUDART_INTERFACE: Table<13> = Table([
    size_of_table(13),
    get_module_from_cubin as *const c_void,
    primary_context as *const c_void,
    NULL,
    NULL,
    NULL,
    get_module_from_cubin_ext1 as *const c_void,
    cudart_notify as *const c_void,
    get_module_from_cubin_ext2 as *const c_void,
    NULL,
    NULL,
    NULL,
    load_compilers as *const c_void,
]);

/// NVIDIA's driver answers with three words; cuBLAS calls slot 2.
static TOOLS_TLS: Table<3> = Table([
    size_of_table(3),
    NULL,
    tools_current_context as *const c_void,
]);

/// 93 words in NVIDIA's driver. cuBLAS calls slots 4, 39 and 51, cuFFT
/// slot 4; cuFFT stops (`CUFFT_INTERNAL_ERROR`) when the table is missing.
static CONTEXT_QUERY: Table<93> = {
    let mut t = [NULL; 93];
    t[0] = size_of_table(93);
    t[4] = context_query_4 as *const c_void;
    t[39] = stream_key_id as *const c_void;
    t[51] = stream_key as *const c_void;
    Table(t)
};

/// cuFFT calls slot 7 `(ctx, module, visit, user)` right after loading
/// each of its modules, with a `visit` that stores the function it is
/// given at `user`: NVIDIA's driver calls it for the module's one kernel
/// and returns 1, and cuFFT unloads a module whose answer is anything
/// else.
static MODULE_QUERY: Table<8> = {
    let mut t = [NULL; 8];
    t[0] = size_of_table(8);
    t[7] = module_query_7 as *const c_void;
    Table(t)
};

/// cuBLASLt calls slot 4 `(out0, out1, _)`, which NVIDIA's driver answers
/// with two host buffers, then slot 13 `(buf0, buf1, 64, 7, ..)`, which
/// fills them with values only that driver can make; a missing table makes
/// cuBLASLt crash. This driver has no such values: both slots fail, and
/// cuBLASLt goes on without them (NVIDIA's driver made to refuse them
/// too, the same GEMMs run at the same speed).
static KERNEL_SESSION: Table<16> = {
    let mut t = [NULL; 16];
    t[0] = size_of_table(16);
    t[4] = kernel_session_open as *const c_void;
    t[13] = kernel_session_fill as *const c_void;
    Table(t)
};

static TOOLS_RUNTIME_CALLBACK_HOOKS: Table<7> = Table([
    size_of_table(7),
    NULL,
    callback_buffer_1 as *const c_void,
    NULL,
    NULL,
    NULL,
    callback_buffer_2 as *const c_void,
]);

static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    cls_put as *const c_void,
    cls_delete as *const c_void,
    cls_get as *const c_void,
    NULL,
]);

static INTEGRITY_CHECK: Table<3> =
    Table([size_of_table(3), integrity_check as *const c_void, NULL]);

static CONTEXT_CHECKS: Table<4> = Table([
    size_of_table(4),
    NULL,
    context_check as *const c_void,
    context_check_3 as *const c_void,
]);

/// Memory the runtime's tool hooks write into; the driver only hands it
/// out, so it lives as long as the process.
struct HookBuffer<const N: usize>(UnsafeCell<[u32; N]>);

// SAFETY: this library never reads or writes the buffer; only the runtime
// does, through the pointer it was given, under its own locking.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static HOOK_BUFFER_1: HookBuffer<1024> = HookBuffer(UnsafeCell::new([0; 1024]));
static HOOK_BUFFER_2: HookBuffer<14> = HookBuffer(UnsafeCell::new([0; 14]));

/// The table for `id`, if this driver has it.
pub fn table(id: &CUuuid) -> Option<*const c_void> {
    Some(match *id {
        CUDART_INTERFACE_ID => CUDART_INTERFACE.ptr(),
        TOOLS_TLS_ID => TOOLS_TLS.ptr(),
        TOOLS_RUNTIME_CALLBACK_HOOKS_ID => TOOLS_RUNTIME_CALLBACK_HOOKS.ptr(),
        CONTEXT_LOCAL_STORAGE_ID => CONTEXT_LOCAL_STORAGE.ptr(),
        INTEGRITY_CHECK_ID => INTEGRITY_CHECK.ptr(),
        CONTEXT_CHECKS_ID => CONTEXT_CHECKS.ptr(),
        CONTEXT_QUERY_ID => CONTEXT_QUERY.ptr(),
        MODULE_QUERY_ID => MODULE_QUERY.ptr(),
        KERNEL_SESSION_ID => KERNEL_SESSION.ptr(),
        _ => return None,
    })
}

/// Loads the fatbinary of a registered wrapper
/// (`{magic, version, data, ...}`) into the current context.
extern "C" fn get_module_from_cubin(module: *mut Handle, wrapper: *const c_void) -> CUresult {
    entry(|| load(module, wrapper))
}

extern "C" fn get_module_from_cubin_ext1(
    module: *mut Handle,
    wrapper: *const c_void,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: u32,
) -> CUresult {
    entry(|| {
        no_options(arg3, arg4, arg5)?;
        load(module, wrapper)
    })
}

/// The extended loaders' options (what they are is not known): only
/// none is understood.
fn no_options(arg3: *mut c_void, arg4: *mut c_void, arg5: u32) -> ffi::CuResult {
    if arg3.is_null() && arg4.is_null() && arg5 == 0 {
        Ok(())
    } else {
        Err(cu::ERROR_NOT_SUPPORTED)
    }
}

extern "C" fn get_module_from_cubin_ext2(
    image: *const c_void,
    module: *mut Handle,
    arg3: *mut c_void,
    arg4: *mut c_void,
    arg5: u32,
) -> CUresult {
    // The first loader with its first two arguments swapped.
    get_module_from_cubin_ext1(module, image, arg3, arg4, arg5)
}

/// The primary context of `dev`, without activating it.
extern "C" fn primary_context(pctx: *mut Handle, dev: i32) -> CUresult {
    entry(|| {
        let ctx = driver()?.gpu(dev)?.primary;
        // SAFETY: the runtime's out-parameter.
        unsafe { ffi::put(pctx, ctx as Handle) }
    })
}

extern "C" fn cudart_notify(_arg: usize) {}

/// Loads the PTX compiler and friends in NVIDIA's driver; PTX goes to the
/// host here.
extern "C" fn load_compilers() -> CUresult {
    cu::SUCCESS
}

extern "C" fn callback_buffer_1(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: the runtime's out-parameters; a null one is ignored.
    unsafe {
        let _ = ffi::put(ptr, HOOK_BUFFER_1.0.get().cast());
        let _ = ffi::put(size, 1024);
    }
}

extern "C" fn callback_buffer_2(ptr: *mut *mut c_void, size: *mut usize) {
    // SAFETY: as callback_buffer_1.
    unsafe {
        let _ = ffi::put(ptr, HOOK_BUFFER_2.0.get().cast());
        let _ = ffi::put(size, 14);
    }
}

/// The context a storage call names: `ctx`, or the current one if null.
fn cls_ctx(ctx: Handle) -> ffi::CuResult<usize> {
    let d = driver()?;
    if ctx.is_null() {
        d.current().ok_or(cu::ERROR_INVALID_CONTEXT)
    } else {
        Ok(ctx as usize)
    }
}

extern "C" fn cls_put(
    ctx: Handle,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<cu::ClsDtor>,
) -> CUresult {
    entry(|| {
        let ctx = cls_ctx(ctx)?;
        let mut o = driver()?.objects();
        let c = o.ctxs_mut().ctxs.get_mut(ctx)?;
        c.store(key as usize, value as usize, dtor);
        Ok(())
    })
}

extern "C" fn cls_delete(ctx: Handle, key: *mut c_void) -> CUresult {
    entry(|| {
        let ctx = cls_ctx(ctx)?;
        let mut o = driver()?.objects();
        let c = o.ctxs_mut().ctxs.get_mut(ctx)?;
        c.unstore(key as usize);
        Ok(())
    })
}

extern "C" fn cls_get(value: *mut *mut c_void, ctx: Handle, key: *mut c_void) -> CUresult {
    entry(|| {
        let ctx = cls_ctx(ctx)?;
        let v = {
            let o = driver()?.objects();
            o.ctxs().ctxs.get(ctx)?.stored(key as usize)?
        };
        // SAFETY: the runtime's out-parameter.
        unsafe { ffi::put(value, v as *mut c_void) }
    })
}

extern "C" fn context_check(
    _ctx: Handle,
    result: *mut u32,
    _result2: *mut *const c_void,
) -> CUresult {
    // SAFETY: the runtime's out-parameter.
    entry(|| unsafe { ffi::put(result, 0) })
}

extern "C" fn context_check_3() -> u32 {
    0
}

/// The calling thread's current context (null if none), as NVIDIA's
/// driver writes it; the other two arguments are not read.
extern "C" fn tools_current_context(
    pctx: *mut Handle,
    _arg2: *mut c_void,
    _arg3: *mut c_void,
) -> CUresult {
    entry(|| {
        let ctx = driver()?.current().unwrap_or(0);
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(pctx, ctx as Handle) }
    })
}

/// What this asks of the context is not known; NVIDIA's driver answers
/// every context with the 64-bit value 1, and so does this one, for a
/// context that exists.
extern "C" fn context_query_4(ctx: Handle, out: *mut u64, _arg3: *mut c_void) -> CUresult {
    entry(|| {
        driver()?.ctx_device(cls_ctx(ctx)?)?;
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, 1) }
    })
}

/// A key for a stream of `ctx` (null: its legacy stream), which cuBLAS
/// hands back to slot 39: the stream's handle, or the context's for the
/// legacy stream (handles never repeat across kinds).
extern "C" fn stream_key(ctx: Handle, stream: Handle, out: *mut usize) -> CUresult {
    entry(|| {
        let d = driver()?;
        let ctx = cls_ctx(ctx)?;
        d.ctx_device(ctx)?;
        let key = if stream.is_null() {
            ctx
        } else {
            crate::streams::stream_id(stream)? as usize
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, key) }
    })
}

/// The id of the stream `key` names (as `cuStreamGetId` gives it).
extern "C" fn stream_key_id(ctx: Handle, key: usize, out: *mut u64) -> CUresult {
    entry(|| {
        let ctx = cls_ctx(ctx)?;
        driver()?.ctx_device(ctx)?;
        let id = if key == ctx {
            0
        } else {
            crate::streams::stream_id(key as Handle)?
        };
        // SAFETY: the caller's out-parameter.
        unsafe { ffi::put(out, id) }
    })
}

/// A function slot 7 of the module query table calls back with each of a
/// module's functions: `(user, function)`.
type FunctionVisitor = extern "C" fn(user: *mut c_void, function: Handle);

/// Slot 7 of the module query table: calls `visit(user, f)` for each
/// function `f` of `module` and returns how many there were (cuFFT's
/// visitor stores the function; its modules hold one kernel each).
extern "C" fn module_query_7(
    _ctx: Handle,
    module: Handle,
    visit: Option<FunctionVisitor>,
    user: *mut c_void,
) -> CUresult {
    let mut count = 0;
    let r = entry(|| {
        let visit = visit.ok_or(cu::ERROR_INVALID_VALUE)?;
        let d = driver()?;
        let mut names: Vec<String> = {
            let o = d.objects();
            let m = o.modules().modules.get(module as usize)?;
            m.kernels
                .iter()
                .chain(&m.cubin_functions)
                .cloned()
                .collect()
        };
        names.sort();
        names.dedup();
        for name in names {
            // Device functions have code but are not entry points.
            match d.get_function(module as usize, &name) {
                Ok(f) => {
                    visit(user, f as Handle);
                    count += 1;
                }
                Err(cu::ERROR_NOT_FOUND) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    if r == cu::SUCCESS {
        count
    } else {
        r
    }
}

extern "C" fn kernel_session_open() -> CUresult {
    crate::state::unsupported("export table 1734dc26 slot 4")
}

extern "C" fn kernel_session_fill() -> CUresult {
    crate::state::unsupported("export table 1734dc26 slot 13")
}

/// The HMAC key of the runtime's driver check (a constant of the
/// protocol).
const INTEGRITY_KEY: [u8; 16] = [
    0x14, 0x6a, 0xdd, 0xae, 0x53, 0xa9, 0xa7, 0x52, 0xaa, 0x08, 0x41, 0x36, 0x0b, 0xf5, 0x5a, 0x9f,
];

/// The runtime proves it talks to a driver that knows the process: it
/// asks for an HMAC-MD2 over the driver version, its own version, the
/// process and thread, the tables' addresses, the time it passes, and
/// each device's UUID and PCI location, and compares it with its own.
extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> CUresult {
    entry(|| {
        let hash = integrity_hash(version, unix_seconds);
        // SAFETY: the runtime's out-parameter.
        unsafe { ffi::put(result, hash) }
    })
}

fn integrity_hash(version: u32, unix_seconds: u64) -> [u64; 2] {
    // Old runtimes (versions ending in 0 or 1) expect fixed answers.
    match version % 10 {
        0 => return [0x3341181c03cb675c, 0x8ed383aa1f4cd1e8],
        1 => return [0x1841181c03cb675c, 0x8ed383aa1f4cd1e8],
        _ => {}
    }
    // SAFETY: pthread_self has no preconditions.
    let thread = unsafe { libc::pthread_self() } as u32;
    let mut msg = Vec::with_capacity(48 + 28 * 4);
    msg.extend_from_slice(&(cu::DRIVER_VERSION as u32).to_ne_bytes());
    msg.extend_from_slice(&version.to_ne_bytes());
    msg.extend_from_slice(&std::process::id().to_ne_bytes());
    msg.extend_from_slice(&thread.to_ne_bytes());
    msg.extend_from_slice(&(CUDART_INTERFACE.ptr() as usize).to_ne_bytes());
    msg.extend_from_slice(&(INTEGRITY_CHECK.ptr() as usize).to_ne_bytes());
    msg.extend_from_slice(&(INTEGRITY_CHECK.0[1] as usize).to_ne_bytes());
    msg.extend_from_slice(&unix_seconds.to_ne_bytes());
    if let Ok(d) = state::driver() {
        for g in &d.gpus {
            msg.extend_from_slice(&g.uuid);
            msg.extend_from_slice(&(g.info.pci_domain as i32).to_ne_bytes());
            msg.extend_from_slice(&i32::from(g.info.pci_bus).to_ne_bytes());
            msg.extend_from_slice(&i32::from(g.info.pci_devfn >> 3).to_ne_bytes());
        }
    }
    let h = crate::md2::hmac_md2(&INTEGRITY_KEY, &[&msg]);
    [
        u64::from_ne_bytes(h[..8].try_into().expect("8 bytes")),
        u64::from_ne_bytes(h[8..].try_into().expect("8 bytes")),
    ]
}

#[no_mangle]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    id: *const CUuuid,
) -> CUresult {
    entry(|| {
        // SAFETY: the caller's in- and out-parameters.
        let id = unsafe { ffi::get(id) }?;
        match self::table(&id) {
            // SAFETY: as above.
            Some(t) => unsafe { ffi::put(table, t) },
            None => {
                crate::diag::log(&format!("cuGetExportTable: no table {:02x?}", id.bytes));
                // What the runtime expects of a table a driver lacks (it
                // asks for some only to take a faster path).
                Err(cu::ERROR_NOT_FOUND)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_are_found_by_id_and_start_with_their_size() {
        for (id, len) in [
            (CUDART_INTERFACE_ID, 13),
            (TOOLS_TLS_ID, 3),
            (CONTEXT_QUERY_ID, 93),
            (TOOLS_RUNTIME_CALLBACK_HOOKS_ID, 7),
            (INTEGRITY_CHECK_ID, 3),
            (CONTEXT_CHECKS_ID, 4),
            (MODULE_QUERY_ID, 8),
            (KERNEL_SESSION_ID, 16),
        ] {
            let t = table(&id).unwrap() as *const usize;
            // SAFETY: every table has at least one word.
            assert_eq!(unsafe { *t }, len * 8);
        }
        assert!(table(&CONTEXT_LOCAL_STORAGE_ID).is_some());
        assert!(table(&uuid(0)).is_none());
    }

    #[test]
    fn the_slots_libraries_call_are_filled() {
        assert!(!TOOLS_TLS.0[2].is_null());
        assert!(!CONTEXT_QUERY.0[4].is_null());
        assert_eq!(CONTEXT_QUERY.0.iter().filter(|p| !p.is_null()).count(), 4);
        assert!(!MODULE_QUERY.0[7].is_null());
        assert!(!KERNEL_SESSION.0[4].is_null() && !KERNEL_SESSION.0[13].is_null());
        // Without a driver the session slots still answer, never crash.
        assert_eq!(kernel_session_open(), cu::ERROR_NOT_SUPPORTED);
        assert_eq!(kernel_session_fill(), cu::ERROR_NOT_SUPPORTED);
    }

    #[test]
    fn the_module_query_needs_a_visitor_and_a_driver() {
        extern "C" fn keep(user: *mut c_void, f: Handle) {
            // SAFETY: the test passes a pointer to a Handle.
            unsafe { *user.cast::<Handle>() = f };
        }
        let mut out = 7 as Handle;
        let user = (&mut out as *mut Handle).cast();
        assert_eq!(
            module_query_7(NULL.cast_mut(), NULL.cast_mut(), None, user),
            cu::ERROR_INVALID_VALUE
        );
        assert_eq!(
            module_query_7(NULL.cast_mut(), NULL.cast_mut(), Some(keep), user),
            cu::ERROR_NOT_INITIALIZED
        );
        assert_eq!(out as usize, 7);
    }

    #[test]
    fn context_answers_need_an_initialised_driver() {
        let mut ctx = 7 as Handle;
        let mut v = 7u64;
        assert_eq!(
            tools_current_context(&mut ctx, NULL.cast_mut(), NULL.cast_mut()),
            cu::ERROR_NOT_INITIALIZED
        );
        assert_eq!(
            context_query_4(std::ptr::null_mut(), &mut v, NULL.cast_mut()),
            cu::ERROR_NOT_INITIALIZED
        );
        assert_eq!((ctx as usize, v), (7, 7));
    }

    #[test]
    fn integrity_answers_depend_on_the_time_asked() {
        assert_eq!(integrity_hash(12090, 5)[0], 0x3341181c03cb675c);
        assert_ne!(integrity_hash(12092, 5), integrity_hash(12092, 6));
    }
}
