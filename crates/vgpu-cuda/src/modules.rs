//! Modules and libraries as the driver loads them (a library's twins on
//! other devices too), their functions and globals, and launches of
//! their kernels.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use vgpu_guest::{sys, Dims, Error as GuestError, Function};

use crate::cu::{self, CUdevice, CUresult, CuResult};
use crate::diag::{check, log};
use crate::module_table::{Func, Library, ModuleObj, DEFAULT_DYNAMIC_SHARED};
use crate::state::Driver;
use crate::work::Work;

/// What an image is loaded as.
#[derive(Clone, Copy)]
pub enum LoadAs {
    /// A module of a context of this device.
    Module(CUdevice),
    /// A library, of no context ([`crate::module_table::Library`]).
    Library,
}

/// Loads `image` as `what`; its handle.
pub fn load_image(d: &Driver, image: &[u8], what: LoadAs) -> CuResult<usize> {
    load_image_why(d, image, what).map_err(|(e, _)| e)
}

/// [`load_image`], with why it failed beside the error: what a JIT
/// error log says.
pub fn load_image_why(d: &Driver, image: &[u8], what: LoadAs) -> Result<usize, (CUresult, String)> {
    match what {
        LoadAs::Module(dev) => d.try_load_module(dev, image),
        LoadAs::Library => d.try_load_library(library_device(d), image),
    }
}

/// CUDA's error for an image the device refused: PTX that does not
/// compile is `CUDA_ERROR_INVALID_PTX`; machine code alone (a cubin, a
/// fatbinary without PTX) that it cannot run, or that its driver
/// refuses, is `CUDA_ERROR_NO_BINARY_FOR_GPU`, as NVIDIA's driver
/// answers machine code for another GPU (the software backend runs
/// only PTX).
fn load_error(has_ptx: bool, e: &GuestError) -> CUresult {
    let status = match e {
        GuestError::Command { status, .. } => *status,
        GuestError::Unsupported => sys::CMD_STATUS_UNSUPPORTED,
        _ => return crate::diag::cu_error(e),
    };
    match status {
        sys::CMD_STATUS_INVALID if has_ptx => cu::ERROR_INVALID_PTX,
        sys::CMD_STATUS_INVALID | sys::CMD_STATUS_UNSUPPORTED if !has_ptx => {
            cu::ERROR_NO_BINARY_FOR_GPU
        }
        _ => crate::diag::cu_error(e),
    }
}

/// The device a library is loaded on. A library belongs to no context:
/// a thread with none current (such as PyTorch's autograd thread, whose
/// first kernel loads its library lazily) may load one. It goes to the
/// current context's device, else to the first device.
pub fn library_device(d: &Driver) -> CUdevice {
    d.current_ctx().map_or(0, |(_, dev)| dev)
}

/// The most blocks one cluster of `f` may have: Hopper's portable 8, or
/// 16 where the kernel allowed non-portable sizes.
pub fn max_cluster_blocks(d: &Driver, f: usize) -> CuResult<u32> {
    let o = d.objects();
    let func = o.modules().funcs.get(f)?;
    let non_portable = func
        .hints
        .get(&cu::FUNC_NON_PORTABLE_CLUSTER_SIZE_ALLOWED)
        .is_some_and(|&v| v != 0);
    Ok(if non_portable {
        vgpu_guest::vgpu_abi::MAX_CLUSTER_BLOCKS
    } else {
        PORTABLE_CLUSTER_BLOCKS
    })
}

/// Blocks of a cluster every kernel may be launched in.
pub const PORTABLE_CLUSTER_BLOCKS: u32 = 8;

/// What a launch needs of its function: its description and device
/// (`None`: the stream is captured, and the launch recorded).
pub type Target = Option<(Arc<Function>, CUdevice)>;

/// Where a launch's function is ([`Driver::launch_target`]).
enum Look {
    /// On the stream's device.
    Here(Target),
    /// On another device than the stream's, this one.
    Elsewhere(CUdevice),
}

impl Driver {
    /// Loads a module image (a fatbinary or PTX text) on `dev` and
    /// records its entry points.
    pub fn load_module(&self, dev: CUdevice, image: &[u8]) -> CuResult<usize> {
        self.try_load_module(dev, image).map_err(|(e, _)| e)
    }

    /// [`Driver::load_module`], with why it failed beside the error.
    pub fn try_load_module(
        &self,
        dev: CUdevice,
        image: &[u8],
    ) -> Result<usize, (CUresult, String)> {
        let gpu = self
            .gpu(dev)
            .map_err(|e| (e, "no such device".to_string()))?;
        let (format, ptx) = module_ptx(image).map_err(|e| (e, "not a module image".to_string()))?;
        let mut kernels = HashSet::new();
        for text in &ptx {
            // The names only; the device's driver compiles the module.
            if let Ok(m) = vgpu_ptx::Module::parse(text) {
                kernels.extend(m.kernels().into_iter().map(|k| k.name));
            }
        }
        // Cubins name their functions in section names; a library that
        // asks the driver to enumerate a module's functions needs them.
        let cubin_functions = if format == sys::MODULE_PTX {
            Vec::new()
        } else {
            vgpu_ptx::function_names(image).unwrap_or_default()
        };
        let module = match gpu.dev.module_load_format(format, image) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                let why = format!("the device refused the module: {e}");
                log(&why);
                return Err((load_error(!ptx.is_empty(), &e), why));
            }
        };
        gpu.console().watch(&module);
        let m = ModuleObj {
            device: dev,
            module,
            kernels,
            cubin_functions,
            globals: HashMap::new(),
            library: None,
        };
        Ok(self
            .objects()
            .file(|o, h| o.modules_mut().modules.insert(h, m)))
    }

    /// [`Driver::load_module`] of a library: where the process has
    /// several devices, the image is kept to load it on the others.
    pub fn load_library(&self, dev: CUdevice, image: &[u8]) -> CuResult<usize> {
        self.try_load_library(dev, image).map_err(|(e, _)| e)
    }

    /// [`Driver::load_library`], with why it failed beside the error.
    pub fn try_load_library(
        &self,
        dev: CUdevice,
        image: &[u8],
    ) -> Result<usize, (CUresult, String)> {
        let h = self.try_load_module(dev, image)?;
        if self.gpus.len() > 1 {
            if let Ok(m) = self.objects().modules_mut().modules.get_mut(h) {
                m.library = Some(Library {
                    image: image.into(),
                    twins: HashMap::new(),
                });
            }
        }
        Ok(h)
    }

    /// `module` as loaded on device `dev`: itself, or a library's twin
    /// there (loaded now if it is not yet). A module of another device's
    /// context is `CUDA_ERROR_INVALID_HANDLE` there, as in CUDA.
    pub fn module_on(&self, module: usize, dev: CUdevice) -> CuResult<usize> {
        let image = {
            let o = self.objects();
            let m = o.modules().modules.get(module)?;
            if m.device == dev {
                return Ok(module);
            }
            let lib = m.library.as_ref().ok_or(cu::ERROR_INVALID_HANDLE)?;
            if let Some(&t) = lib.twins.get(&dev) {
                return Ok(t);
            }
            Arc::clone(&lib.image)
        };
        let twin = self.load_module(dev, &image)?;
        let mut o = self.objects();
        let kept = match o
            .modules_mut()
            .modules
            .get_mut(module)
            .ok()
            .and_then(|m| m.library.as_mut())
        {
            Some(lib) => Ok(*lib.twins.entry(dev).or_insert(twin)),
            None => Err(cu::ERROR_INVALID_HANDLE),
        };
        drop(o);
        if kept != Ok(twin) {
            // Unloaded, or loaded there by another thread, meanwhile.
            let _ = self.unload_module(twin);
        }
        kept
    }

    /// Function `func` as it runs on device `dev`: itself, or its
    /// library's kernel of the same name on that device.
    pub fn function_on(&self, func: usize, dev: CUdevice) -> CuResult<usize> {
        let (module, name) = {
            let o = self.objects();
            let f = o.modules().funcs.get(func)?;
            if f.device == dev {
                return Ok(func);
            }
            (f.module, f.cname.clone())
        };
        let twin = self.module_on(module, dev)?;
        self.get_function(twin, name.to_str().map_err(|_| cu::ERROR_INVALID_VALUE)?)
    }

    /// Global `name` of module `module`: its device address and size.
    pub fn get_global(&self, module: usize, name: &str) -> CuResult<(u64, u64)> {
        let (m, device) = {
            let o = self.objects();
            let m = o.modules().modules.get(module)?;
            if let Some(&g) = m.globals.get(name) {
                return Ok(g);
            }
            (m.module.clone(), m.device)
        };
        let g = match self.gpu(device)?.dev.global(&m, name) {
            Err(GuestError::NotFound) => return Err(cu::ERROR_NOT_FOUND),
            r => check(r)?,
        };
        let ctx = self.current().unwrap_or(0);
        let mut o = self.objects();
        if let Ok(m) = o.modules_mut().modules.get_mut(module) {
            m.globals.insert(name.to_string(), g);
            // cudaMemcpyToSymbol copies to what cuModuleGetGlobal gave.
            o.allocs_mut().add_global(module, g.0, g.1, device, ctx);
        }
        Ok(g)
    }

    /// The function `name` of module `module`, as the device describes it.
    pub fn get_function(&self, module: usize, name: &str) -> CuResult<usize> {
        let (m, device) = {
            let o = self.objects();
            let m = o.modules().modules.get(module)?;
            // One handle per (module, name), as CUDA returns the same
            // CUfunction for repeated look-ups.
            if let Some(h) = o.modules().function_named(module, name) {
                return Ok(h);
            }
            (m.module.clone(), m.device)
        };
        let gpu = self.gpu(device)?;
        let function = match gpu.dev.function(&m, name) {
            Err(GuestError::NotFound) => return Err(cu::ERROR_NOT_FOUND),
            r => check(r)?,
        };
        let max_dynamic_shared = DEFAULT_DYNAMIC_SHARED
            .saturating_sub(function.info.shared_static)
            .min(function.info.max_dynamic_shared);
        let cname = std::ffi::CString::new(name).map_err(|_| cu::ERROR_INVALID_VALUE)?;
        let mut o = self.objects();
        if !o.modules().modules.contains(module) {
            // Unloaded by another thread meanwhile.
            return Err(cu::ERROR_INVALID_HANDLE);
        }
        let h = o.handle();
        o.modules_mut().funcs.insert(
            h,
            Func {
                module,
                device,
                function: Arc::new(function),
                cname,
                max_dynamic_shared,
                hints: HashMap::new(),
                clusters: HashMap::new(),
            },
        );
        Ok(h)
    }

    /// Unloads a module and forgets its functions.
    pub fn unload_module(&self, module: usize) -> CuResult {
        let m = {
            let mut o = self.objects();
            o.remove_module(module).ok_or(cu::ERROR_INVALID_HANDLE)?
        };
        // A library's twins on other devices go with it.
        for &twin in m.library.iter().flat_map(|l| l.twins.values()) {
            let _ = self.unload_module(twin);
        }
        // What its kernels printed comes out first, as CUDA's driver
        // flushes its printf buffer at an unload.
        if m.module.prints() {
            if let Ok(gpu) = self.gpu(m.device) {
                gpu.wait_idle();
            }
        }
        // The device unloads it when the last user (a launch in flight
        // on another thread) lets go.
        drop(m);
        Ok(())
    }

    /// What a launch of `func` on `stream` needs to know: the function
    /// that runs (`func`, or its library's twin on the stream's device)
    /// and, from one look at the objects, its description and device
    /// (checked against its dynamic shared memory limit for
    /// `shared_mem`), or `None` where the stream is being captured (the
    /// launch is then recorded, the slower way). The stream must exist.
    pub fn launch_target(
        &self,
        func: usize,
        stream: usize,
        shared_mem: u32,
    ) -> CuResult<(usize, Target)> {
        match self.launch_look(func, stream, shared_mem)? {
            Look::Here(target) => Ok((func, target)),
            Look::Elsewhere(dev) => {
                let twin = self.function_on(func, dev)?;
                match self.launch_look(twin, stream, shared_mem)? {
                    Look::Here(target) => Ok((twin, target)),
                    Look::Elsewhere(_) => Err(cu::ERROR_INVALID_HANDLE),
                }
            }
        }
    }

    /// [`Driver::launch_target`] for `func` as it is.
    fn launch_look(&self, func: usize, stream: usize, shared_mem: u32) -> CuResult<Look> {
        let current = if stream <= 2 {
            Some(self.current().ok_or(cu::ERROR_INVALID_CONTEXT)?)
        } else {
            None
        };
        let o = self.objects();
        let ctx = match current {
            Some(c) => c,
            None => o.streams().streams.get(stream)?.ctx,
        };
        let dev = o.ctxs().ctxs.get(ctx)?.device();
        let f = o.modules().funcs.get(func)?;
        if f.device != dev {
            return Ok(Look::Elsewhere(dev));
        }
        if o.graphs().is_capturing(stream) {
            return Ok(Look::Here(None));
        }
        if shared_mem > f.max_dynamic_shared {
            log(&format!(
                "{:?}: {} bytes of dynamic shared memory, the function allows {} (cuFuncSetAttribute raises it)",
                f.cname, shared_mem, f.max_dynamic_shared
            ));
            return Err(cu::ERROR_INVALID_VALUE);
        }
        Ok(Look::Here(Some((Arc::clone(&f.function), f.device))))
    }

    /// Launches `func` on `stream` with its parameters packed as its
    /// layout says, in clusters of `shape.0` blocks, cooperative if
    /// `shape.1`.
    pub fn launch(
        &self,
        func: usize,
        dims: Dims,
        shape: ([u32; 3], bool),
        params: &[u8],
        stream: usize,
    ) -> CuResult {
        let (device, work) = self.launch_work(func, dims, shape, params)?;
        self.queue(stream, device, &[work])
    }

    /// The work of a launch of `func` (checked against its dynamic shared
    /// memory limit) in clusters of `cluster` blocks, cooperative if
    /// `cooperative`, and the device it runs on.
    pub fn launch_work(
        &self,
        func: usize,
        dims: Dims,
        (cluster, cooperative): ([u32; 3], bool),
        params: &[u8],
    ) -> CuResult<(CUdevice, Work)> {
        let (function, device) = {
            let o = self.objects();
            let f = o.modules().funcs.get(func)?;
            if dims.shared_mem > f.max_dynamic_shared {
                log(&format!(
                    "{:?}: {} bytes of dynamic shared memory, the function allows {} (cuFuncSetAttribute raises it)",
                    f.cname, dims.shared_mem, f.max_dynamic_shared
                ));
                return Err(cu::ERROR_INVALID_VALUE);
            }
            (Arc::clone(&f.function), f.device)
        };
        let work = Work::Launch {
            func,
            function,
            dims,
            cluster,
            cooperative,
            params: params.into(),
        };
        Ok((device, work))
    }
}

/// The module format and the PTX texts of an image: a fatbinary (as
/// `nvcc` embeds it, starting with its header) or PTX text.
fn module_ptx(image: &[u8]) -> CuResult<(u32, Vec<String>)> {
    let format = if vgpu_ptx::fatbin::is_ptx_text(image) {
        sys::MODULE_PTX
    } else if vgpu_ptx::is_cubin(image) {
        // Machine code for one GPU, no PTX: the device's driver runs it.
        return Ok((sys::MODULE_CUBIN, Vec::new()));
    } else {
        sys::MODULE_FATBIN
    };
    // A fatbinary of cubins alone has no PTX: the device's driver picks
    // the cubin for its GPU.
    let ptx = match vgpu_ptx::extract_ptx(image) {
        Ok(ptx) => ptx,
        Err(vgpu_ptx::FatbinError::NoPtx) => Vec::new(),
        Err(e) => {
            log(&format!("module image: {e}"));
            return Err(cu::ERROR_INVALID_IMAGE);
        }
    };
    Ok((format, ptx))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_classified_by_content() {
        let ptx = b".version 8.0\n.target sm_80\n.address_size 64\n.visible .entry k() { ret; }\n";
        let (format, texts) = module_ptx(ptx).unwrap();
        assert_eq!(format, sys::MODULE_PTX);
        assert_eq!(texts.len(), 1);
        assert_eq!(
            module_ptx(b"\x7fELF....").err(),
            Some(cu::ERROR_INVALID_IMAGE)
        );
        let mut cubin = b"\x7fELF\x02\x01".to_vec();
        cubin.resize(64, 0);
        cubin[18] = 190;
        assert_eq!(module_ptx(&cubin), Ok((sys::MODULE_CUBIN, Vec::new())));
    }

    #[test]
    fn refused_images_answer_as_nvidias_driver() {
        let cmd = |status| GuestError::Command {
            index: 0,
            status,
            source: Box::new(GuestError::Io),
        };
        // PTX that does not compile.
        assert_eq!(
            load_error(true, &cmd(sys::CMD_STATUS_INVALID)),
            cu::ERROR_INVALID_PTX
        );
        // Machine code the device cannot run (the software backend's
        // answer to a cubin) or its driver refuses.
        for status in [sys::CMD_STATUS_UNSUPPORTED, sys::CMD_STATUS_INVALID] {
            assert_eq!(load_error(false, &cmd(status)), cu::ERROR_NO_BINARY_FOR_GPU);
        }
        // A device that refuses guest modules altogether, and the rest.
        assert_eq!(
            load_error(true, &cmd(sys::CMD_STATUS_UNSUPPORTED)),
            cu::ERROR_NOT_SUPPORTED
        );
        assert_eq!(
            load_error(false, &cmd(sys::CMD_STATUS_NO_MEMORY)),
            cu::ERROR_OUT_OF_MEMORY
        );
    }
}
