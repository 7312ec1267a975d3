//! Modules, libraries and their functions, each behind a handle: the
//! table of them that [`crate::objects::Objects`] holds.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use vgpu_guest::{Function, Module};

use crate::cu::CUdevice;
use crate::handles::Handles;

/// A loaded module (or library: CUDA's context-independent module).
pub struct ModuleObj {
    /// The device it is loaded on.
    pub device: CUdevice,
    /// The device's module, shared with the launches of its kernels.
    pub module: Arc<Module>,
    /// The entry points its PTX names.
    pub kernels: HashSet<String>,
    /// The functions its cubins have code for: entry points and device
    /// functions alike, which only the device tells apart.
    pub cubin_functions: Vec<String>,
    /// Globals looked up: address and size.
    pub globals: HashMap<String, (u64, u64)>,
    /// For a library of a process with several devices: what loads it on
    /// the others.
    pub library: Option<Library>,
}

/// A library (`cuLibraryLoadData`) belongs to no context: its kernels
/// run on whichever device launches them. It is loaded where it was
/// first asked for; on another device, a copy of its image is loaded as
/// a module of its own (a *twin*) the first time one of its kernels runs
/// there, and unloaded with it.
pub struct Library {
    /// The image, kept to load it on other devices.
    pub image: Arc<[u8]>,
    /// Its twin module on each other device it was loaded on.
    pub twins: HashMap<CUdevice, usize>,
}

/// A function (or kernel) of a module.
pub struct Func {
    /// The module it belongs to.
    pub module: usize,
    /// The device of that module.
    pub device: CUdevice,
    /// The device's description and handle of it, shared with the
    /// launches that use it (a launch takes no copy of the layout).
    pub function: Arc<Function>,
    /// The name, NUL-terminated, for `cuFuncGetName`.
    pub cname: std::ffi::CString,
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`: what a launch
    /// may use, raised by `cuFuncSetAttribute`.
    pub max_dynamic_shared: u32,
    /// Attributes set as hints (`cuFuncSetAttribute`), read back as set.
    pub hints: HashMap<i32, i32>,
    /// The device's answers to `cuOccupancyMaxActiveClusters`, by block,
    /// dynamic shared memory and cluster: libraries ask the same shapes
    /// again, and each question is a device round trip.
    pub clusters: HashMap<ClusterShape, u32>,
}

/// What a cluster occupancy answer depends on: block, dynamic shared
/// memory, cluster.
pub type ClusterShape = ([u32; 3], u32, [u32; 3]);

/// Most cluster occupancy answers kept per function.
pub const MAX_CLUSTER_ANSWERS: usize = 64;

/// Dynamic shared memory a kernel may use until it opts in to more.
pub const DEFAULT_DYNAMIC_SHARED: u32 = 48 << 10;

/// The modules (and libraries) loaded, and the functions looked up in
/// them.
#[derive(Default)]
pub struct Modules {
    /// Modules and libraries, by handle.
    pub modules: Handles<ModuleObj>,
    /// Functions and kernels, by handle; a module's stay until
    /// [`Modules::forget_functions_of`].
    pub funcs: Handles<Func>,
}

impl Modules {
    /// The handle already given to function `name` of `module`, if one
    /// was.
    pub fn function_named(&self, module: usize, name: &str) -> Option<usize> {
        self.funcs
            .iter()
            .find(|(_, f)| f.module == module && f.cname.as_bytes() == name.as_bytes())
            .map(|(h, _)| h)
    }

    /// Forgets every function of `module`.
    pub fn forget_functions_of(&mut self, module: usize) {
        self.funcs.retain(|_, f| f.module != module);
    }
}
