//! Modules a guest loads, run on the partition's worker threads by the
//! PTX executor (`vgpu-ptx`): the PTX of an image, the partition's
//! allocations as the kernel's global memory, and the executor's errors
//! as the statuses the CUDA backend reports.

use std::cell::RefMut;
use std::time::{Duration, Instant};

use vgpu_abi as abi;
use vgpu_ptx::{ExecError, FatbinError, Fault, GlobalMemory, Module, WordMemory};

use vgpu_sys::warn_limited;

use super::DeviceBuf;
use crate::console::ConsoleText;
use crate::rules::{self, Allocations};
use crate::{FunctionInfo, OpError};

/// Shared memory a block may use (static and dynamic), as on an H100.
pub(super) const MAX_SHARED: u32 = 227 << 10;
/// Registers of an SM, as on an H100: what occupancy calculators divide.
const REGISTERS_PER_SM: u32 = 65536;
/// Local memory (stack) a thread may use.
const MAX_LOCAL_PER_THREAD: u32 = 64 << 10;
/// How long a kernel may run when the operator sets nothing.
pub const DEFAULT_KERNEL_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a module image of `format` into a module. A refused module,
/// and a module some of whose kernels this executor cannot run, is
/// logged (rate-limited: guests choose what they load) with the PTX line
/// and the reason, as `partition` names it; the guest sees only a status.
pub(super) fn load(partition: &str, format: u32, image: &[u8]) -> Result<Module, OpError> {
    let texts = match format {
        abi::MODULE_FORMAT_PTX => {
            let text = std::str::from_utf8(rules::ptx_text(image)?)
                .map_err(|e| OpError::Invalid(format!("PTX image is not UTF-8: {e}")))?;
            vec![text.to_string()]
        }
        abi::MODULE_FORMAT_FATBIN => {
            vgpu_ptx::extract_ptx(rules::module_image(image)?).map_err(|e| match e {
                FatbinError::NoPtx => OpError::Unsupported(
                    "the fatbinary holds no PTX; the software backend runs PTX, not cubins".into(),
                ),
                e => OpError::Invalid(format!("fatbinary: {e}")),
            })?
        }
        other => {
            return Err(OpError::Unsupported(format!(
                "module format {other}: the software backend loads PTX ({}) and fatbinaries ({})",
                abi::MODULE_FORMAT_PTX,
                abi::MODULE_FORMAT_FATBIN
            )))
        }
    };
    // A fatbinary may carry PTX for several targets: any of them runs
    // here, so the first that parses is taken.
    let mut first_error = None;
    for text in &texts {
        match Module::parse(text) {
            Ok(m) => {
                log_refusals(partition, &m, text);
                return Ok(m);
            }
            Err(e) => {
                first_error.get_or_insert((e, text));
            }
        }
    }
    let why = match first_error {
        Some((e, text)) => format!("PTX rejected: {}", described(&e, text)),
        None => "the image holds no PTX".into(),
    };
    warn_limited!("software backend: partition {partition:?}: module refused: {why}");
    Err(OpError::Invalid(why))
}

/// Longest PTX source line quoted in a message.
const QUOTED_LINE: usize = 160;

/// `e` with its PTX line quoted from `text` (escaped: the text is the
/// guest's).
pub(super) fn described(e: &vgpu_ptx::ParseError, text: &str) -> String {
    let source = text
        .lines()
        .nth((e.line as usize).saturating_sub(1))
        .map(str::trim)
        .unwrap_or("");
    let cut = source
        .char_indices()
        .nth(QUOTED_LINE)
        .map_or(source, |(i, _)| &source[..i]);
    format!("line {} {cut:?}: {}", e.line, e.msg)
}

/// Says which kernels of a loaded module cannot run here, and why.
fn log_refusals(partition: &str, m: &Module, text: &str) {
    let Some(first) = m.refusals().first() else {
        return;
    };
    let kernels = m.kernels();
    let refused: Vec<&str> = kernels
        .iter()
        .filter(|k| m.refused(&k.name).is_some())
        .map(|k| k.name.as_str())
        .collect();
    warn_limited!(
        "software backend: partition {partition:?}: module loaded, {} of its {} kernels cannot run here ({}{}); {} unsupported instructions, the first at {}",
        refused.len(),
        kernels.len(),
        refused.iter().take(4).copied().collect::<Vec<_>>().join(", "),
        if refused.len() > 4 { ", ..." } else { "" },
        m.refusals().len(),
        described(first, text)
    );
}

/// The partition's allocations as a kernel's global memory: every access
/// must fall inside one allocation, as for every other command.
struct Allocated<'a> {
    /// By base address, each with whether it may only be read (a
    /// mapping given read access alone).
    regions: Vec<(WordMemory<'a>, bool)>,
}

impl Allocated<'_> {
    fn region(&self, addr: u64, len: usize, write: bool) -> Result<&WordMemory<'_>, Fault> {
        let fault = Fault {
            addr,
            len: len as u64,
        };
        let i = self.regions.partition_point(|r| r.0.base() <= addr);
        let (r, read_only) = i.checked_sub(1).map(|i| &self.regions[i]).ok_or(fault)?;
        let inside = (addr - r.base())
            .checked_add(len as u64)
            .is_some_and(|end| end <= r.len());
        (inside && !(write && *read_only)).then_some(r).ok_or(fault)
    }
}

impl GlobalMemory for Allocated<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), Fault> {
        self.region(addr, buf.len(), false)?.read(addr, buf)
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), Fault> {
        self.region(addr, buf.len(), true)?.write(addr, buf)
    }

    fn atomic(&self, addr: u64, op: vgpu_ptx::AtomicOp, b: u64, c: u64) -> Result<u64, Fault> {
        self.region(addr, op.size(), true)?.atomic(addr, op, b, c)
    }
}

/// One launch of a loaded kernel.
pub(super) struct Run<'a> {
    pub module: &'a Module,
    /// Where the module's variables live in the partition's memory.
    pub statics: Option<u64>,
    pub entry: &'a str,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub params: &'a [u8],
    pub workers: usize,
    /// A cooperative launch's grid workspace (8 zeroed bytes).
    pub grid_sync: Option<u64>,
    pub timeout: Duration,
    /// Where the kernel's `printf` output goes.
    pub print: &'a dyn vgpu_ptx::PrintSink,
}

/// Kernel `entry` of `module` as FUNC_INFO describes it: the layout the
/// PTX declares, the limits this executor sets.
pub(super) fn function_info(module: &Module, entry: &str) -> Result<FunctionInfo, OpError> {
    let info = module
        .kernel(entry)
        .ok_or_else(|| OpError::NotFound(format!("entry point {entry:?} in the module")))?;
    let ptx_version = target_version(module.target());
    let max_threads = info.max_threads.unwrap_or(1024).clamp(1, 1024);
    let attrs = abi::FuncInfo {
        max_threads,
        shared_static: info.shared_static,
        max_dynamic_shared: MAX_SHARED.saturating_sub(info.shared_static),
        local_bytes: info.local_per_thread,
        // The executor has no register file: a block of up to
        // `max_threads` always runs. What a compiler fitting such a block
        // into an SM's 65536 registers would allocate at most, then, not
        // the PTX's virtual registers, which run to hundreds in library
        // kernels and would make occupancy calculators (the runtime's,
        // CUB's) find no block resident.
        num_regs: info.registers.min(REGISTERS_PER_SM / max_threads).min(255),
        ptx_version,
        ..Default::default()
    };
    let params = info.params.iter().map(|p| (p.offset, p.size));
    rules::checked_function_info(entry, FunctionInfo::new(params, attrs))
}

/// CU_FUNC_ATTRIBUTE_PTX_VERSION: the virtual architecture the PTX was
/// written for (`.target sm_80` is 80; `sm_90a` 90), not the PTX ISA's
/// `.version`. Libraries choose their code paths by it: CUB refuses to run
/// (cudaErrorInvalidDeviceFunction) when it names an architecture the
/// program was not compiled for. 0 (the device's) when the target names
/// none.
pub(super) fn target_version(target: &str) -> u32 {
    let first = target.split(',').next().unwrap_or("").trim();
    let digits: String = first
        .strip_prefix("sm_")
        .or_else(|| first.strip_prefix("compute_"))
        .unwrap_or("")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// Checks a launch against the kernel and runs it on `allocs`.
pub(super) fn launch(
    run: &Run<'_>,
    allocs: &Allocations<std::cell::RefCell<DeviceBuf>>,
) -> Result<(), OpError> {
    let entry = run.entry;
    let limits = rules::KernelLimits::of(&function_info(run.module, entry)?);
    rules::check_module_launch(
        entry,
        run.grid,
        run.block,
        run.shared_mem,
        run.params,
        &limits,
    )?;
    // Every allocation, borrowed exclusively for the launch.
    let mut bufs: Vec<(u64, u64, RefMut<'_, DeviceBuf>)> = allocs
        .iter()
        .map(|(start, e)| (start, e.size, e.data.borrow_mut()))
        .collect();
    let regions = bufs
        .iter_mut()
        .filter_map(|(start, size, buf)| {
            let read_only = buf.read_only();
            WordMemory::new(*start, *size, buf.words()).map(|w| (w, read_only))
        })
        .collect();
    let mem = Allocated { regions };
    let cfg = vgpu_ptx::LaunchConfig {
        grid: run.grid,
        block: run.block,
        shared_dyn: run.shared_mem,
        workers: run.workers,
    };
    let limits = vgpu_ptx::Limits {
        max_shared: MAX_SHARED,
        max_local_per_thread: MAX_LOCAL_PER_THREAD,
        max_steps: None,
        deadline: Some(Instant::now() + run.timeout),
        cancel: None,
        print: Some(run.print),
        statics: run.statics,
        grid_sync: run.grid_sync,
    };
    vgpu_ptx::launch(run.module, entry, &cfg, run.params, &mem, &limits)
        .map(|_| ())
        .map_err(|e| status(entry, run.timeout, e))
}

/// The status the CUDA backend gives the same failure: a kernel's bad
/// memory access (an illegal or misaligned address) is a kernel fault
/// (the guest's CUDA_ERROR_ILLEGAL_ADDRESS), one that runs too long a
/// device error (the watchdog ends it); what the driver refuses
/// before running is an invalid argument. Unlike a GPU's, the partition
/// keeps its state after a fault (every access was checked, nothing was
/// written out of place): [`Partition::is_lost`](crate::Partition::is_lost)
/// stays false and only the faulting launch fails.
fn status(entry: &str, timeout: Duration, e: ExecError) -> OpError {
    match e {
        ExecError::NoKernel(_) => OpError::NotFound(format!("entry point {entry:?}")),
        ExecError::IllegalAddress { .. } | ExecError::MisalignedAddress { .. } => {
            OpError::KernelFault(format!("{entry}: {e}"))
        }
        ExecError::Assert(_) => OpError::KernelAssert(format!("{entry}: {e}")),
        // The module loaded (its other kernels run); this one reaches an
        // instruction the executor does not run, which load logged.
        ExecError::Refused(_) => {
            warn_limited!("software backend: kernel {entry:?} cannot run here: {e}");
            OpError::Unsupported(format!("{entry}: {e}"))
        }
        ExecError::Timeout => OpError::Device(format!(
            "{entry}: ran longer than the {} ms kernel watchdog",
            timeout.as_millis()
        )),
        ExecError::BadLaunch(_)
        | ExecError::SharedTooLarge { .. }
        | ExecError::LocalTooLarge { .. } => OpError::Invalid(format!("{entry}: {e}")),
        e => OpError::Device(format!("{entry}: {e}")),
    }
}

/// A launch's `printf` output, gathered from its worker threads: at most
/// a console's worth, the rest counted.
#[derive(Debug, Default)]
pub(super) struct Printed(std::sync::Mutex<ConsoleText>);

impl Printed {
    /// The output and the bytes that did not fit.
    pub fn into_inner(self) -> ConsoleText {
        self.0.into_inner().unwrap_or_else(|e| e.into_inner())
    }
}

impl vgpu_ptx::PrintSink for Printed {
    fn print(&self, text: &[u8]) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(text);
    }
}
