//! A decoded PTX module: its code, its functions and what it tells of
//! each kernel (parameters, shared and local memory, registers).

use crate::ir::Inst;

/// One kernel parameter as `cuFuncGetParamInfo` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParamInfo {
    /// Offset in the parameter buffer.
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Alignment in bytes.
    pub align: u32,
}

/// Launch metadata of a kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelInfo {
    /// The entry's name.
    pub name: String,
    /// Its parameters, in order.
    pub params: Vec<ParamInfo>,
    /// Size of the parameter buffer (end of the last parameter).
    pub param_bytes: u32,
    /// Static shared memory: what the `.shared` variables the kernel and
    /// the functions it calls name take, as a GPU reports it.
    pub shared_static: u32,
    /// The end of the last of them in the module's one layout of
    /// `.shared` variables (all kernels'): the executor's block holds
    /// this much before the dynamic shared memory.
    pub shared_layout: u32,
    /// Local memory per thread (all `.local` variables of the module).
    pub local_per_thread: u32,
    /// Registers declared by the kernel and the functions it may call, in
    /// 32-bit units (PTX virtual registers: an upper bound on what `ptxas`
    /// would allocate).
    pub registers: u32,
    /// `.reqntid` / `.maxntid`, when given.
    pub max_threads: Option<u32>,
}

#[derive(Debug, Clone)]
pub(crate) struct Func {
    pub name: String,
    pub entry: bool,
    pub start: u32,
    pub defined: bool,
    pub params: Vec<(ParamInfo, u32)>,
    /// Offset and size of the return value in the per-thread param space.
    pub ret: Option<(u32, u32)>,
    pub regs32: u32,
    pub max_threads: Option<u32>,
    pub line: u32,
    /// End of the `.shared` variables the function and all it may call
    /// name, in the module's layout.
    pub shared_total: u32,
    /// Offsets of the `.shared` variables the function itself names.
    pub shared_vars: Vec<u32>,
    /// What the variables of the function and all it may call take.
    pub shared_size: u32,
    /// One past its last instruction.
    pub end: u32,
    /// Its registers: indices `regs.0..regs.1`.
    pub regs: (u32, u32),
    /// The register ranges of the function and all it may call.
    pub reach_regs: Vec<(u32, u32)>,
    /// 32-bit register units of the function and all it may call.
    pub regs32_total: u32,
    /// The first refused instruction it may reach (an index in
    /// [`Module::refusals`]).
    pub refused: Option<u32>,
}

/// A parsed and decoded PTX module.
#[derive(Debug, Clone)]
pub struct Module {
    pub(crate) code: Vec<Inst>,
    pub(crate) funcs: Vec<Func>,
    pub(crate) nregs: u32,
    pub(crate) statics: Vec<u8>,
    pub(crate) shared_static: u32,
    pub(crate) local_size: u32,
    pub(crate) param_size: u32,
    pub(crate) version: String,
    pub(crate) target: String,
    /// Instructions this executor does not run, in source order.
    pub(crate) refused: Vec<ParseError>,
    /// The module-scope `.global` and `.const` variables: name, offset in
    /// [`Module::statics`], size.
    pub(crate) variables: Vec<(String, u32, u32)>,
}

impl Module {
    /// The `.version` directive's value.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The `.target` directive's value.
    pub fn target(&self) -> &str {
        &self.target
    }

    /// The initial bytes of the module's `.global` and `.const`
    /// variables, laid out as [`Module::variable`] places them (what a
    /// launch sees unless [`Limits::statics`](crate::Limits::statics)
    /// puts them in device memory).
    pub fn statics(&self) -> &[u8] {
        &self.statics
    }

    /// Module variable `name` (`.global` or `.const`, at module scope):
    /// its offset in [`Module::statics`] and its size.
    pub fn variable(&self, name: &str) -> Option<(u32, u32)> {
        self.variables
            .iter()
            .find(|v| v.0 == name)
            .map(|v| (v.1, v.2))
    }

    /// Every kernel (`.entry`) of the module.
    pub fn kernels(&self) -> Vec<KernelInfo> {
        self.funcs
            .iter()
            .filter(|f| f.entry && f.defined)
            .map(|f| self.info(f))
            .collect()
    }

    /// One kernel by name.
    pub fn kernel(&self, name: &str) -> Option<KernelInfo> {
        self.funcs
            .iter()
            .find(|f| f.entry && f.defined && f.name == name)
            .map(|f| self.info(f))
    }

    /// The valid PTX instructions of the module that this executor does
    /// not run (each with its line and why). A kernel that may execute
    /// one of them does not launch ([`Module::refused`]); the module's
    /// other kernels do.
    pub fn refusals(&self) -> &[ParseError] {
        &self.refused
    }

    /// Why kernel `name` cannot run here: the first instruction it may
    /// reach (itself or through its calls) that this executor refuses.
    pub fn refused(&self, name: &str) -> Option<&ParseError> {
        let f = &self.funcs[self.func_index(name)?];
        self.refused.get(f.refused? as usize)
    }

    pub(crate) fn func_index(&self, name: &str) -> Option<usize> {
        self.funcs
            .iter()
            .position(|f| f.entry && f.defined && f.name == name)
    }

    fn info(&self, f: &Func) -> KernelInfo {
        let params: Vec<ParamInfo> = f.params.iter().map(|p| p.0).collect();
        let param_bytes = params.iter().map(|p| p.offset + p.size).max().unwrap_or(0);
        KernelInfo {
            name: f.name.clone(),
            params,
            param_bytes,
            shared_static: f.shared_size,
            shared_layout: f.shared_total,
            local_per_thread: self.local_size,
            // Callees' registers count too: .func registers are not shared.
            registers: f.regs32_total,
            max_threads: f.max_threads,
        }
    }
}

/// What is wrong with a PTX text, and on which line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct ParseError {
    /// 1-based source line.
    pub line: u32,
    /// What is wrong.
    pub msg: String,
    /// Valid PTX that this executor does not run (an instruction or a
    /// form of one), rather than malformed text.
    pub unsupported: bool,
}

impl ParseError {
    pub(crate) fn new(line: u32, msg: impl Into<String>) -> ParseError {
        ParseError {
            line,
            msg: msg.into(),
            unsupported: false,
        }
    }
}
