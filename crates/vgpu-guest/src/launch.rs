//! Kernel launches: their shape, the built-in kernels' parameter blocks,
//! functions of loaded modules and the LAUNCH commands built from them.

use vgpu_abi::{self as abi, ByteValued};

use crate::error::{Error, Result};
use crate::sys::{self, VgpuCmd};

/// Launch shape of a kernel. The device enforces CUDA's limits (at most
/// 1024 threads per block, grid y and z at most 65535).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory, bytes.
    pub shared_mem: u32,
}

impl Default for Dims {
    /// One block of 256 threads.
    fn default() -> Self {
        Dims {
            grid: [1, 1, 1],
            block: [256, 1, 1],
            shared_mem: 0,
        }
    }
}

impl Dims {
    /// Threads per block of [`Dims::linear`].
    pub const BLOCK: u32 = 256;

    /// One thread per element: blocks of [`Dims::BLOCK`] threads.
    pub fn linear(elements: u64) -> Dims {
        let blocks = elements.div_ceil(u64::from(Self::BLOCK)).max(1);
        Dims {
            grid: [blocks.min(i32::MAX as u64) as u32, 1, 1],
            block: [Self::BLOCK, 1, 1],
            shared_mem: 0,
        }
    }
}

/// A parameter block of a built-in kernel (`vgpu_abi::*Params`).
pub trait BuiltinKernel: ByteValued {
    /// Entry point in the built-in module.
    const ENTRY: &'static str;
    /// A launch shape that covers the work.
    fn dims(&self) -> Dims;
}

/// Kernels of one thread per element: parameters => entry point, elements.
macro_rules! linear_kernels {
    ($($params:ident => $entry:literal, |$p:ident| $elements:expr;)*) => {$(
        impl BuiltinKernel for vgpu_abi::$params {
            const ENTRY: &'static str = $entry;
            fn dims(&self) -> Dims {
                let $p = self;
                Dims::linear($elements)
            }
        }
    )*};
}

linear_kernels! {
    FillParams => "fill_u32", |p| p.count;
    // One thread per 32-bit word.
    CopyParams => "copy", |p| p.bytes.div_ceil(4);
    VaddParams => "vadd_f32", |p| p.n;
    SaxpyParams => "saxpy_f32", |p| p.n;
    ReduceSumParams => "reduce_sum_f32", |p| p.n;
}

impl BuiltinKernel for vgpu_abi::SgemmParams {
    const ENTRY: &'static str = "sgemm_f32";
    fn dims(&self) -> Dims {
        // 16 x 16 threads per block, one thread per element of C.
        Dims {
            grid: [
                self.n.div_ceil(16).max(1),
                self.m.div_ceil(16).clamp(1, 65535),
                1,
            ],
            block: [16, 16, 1],
            shared_mem: 0,
        }
    }
}

/// A LAUNCH command.
pub(crate) fn launch_cmd(module: u64, entry: &str, dims: Dims, params: &[u8]) -> Result<VgpuCmd> {
    let name = sys::entry_name(entry)
        .ok_or_else(|| Error::Usage(format!("bad entry point name {entry:?}")))?;
    launch_entry_cmd(module, name, dims, params)
}

/// A LAUNCH command of a function handle.
pub(crate) fn launch_function_cmd(f: &Function, dims: Dims, params: &[u8]) -> Result<VgpuCmd> {
    launch_cluster_cmd(f, dims, [1, 1, 1], false, params)
}

/// A LAUNCH command of a function handle in clusters of `cluster` blocks,
/// cooperative (every block resident at once) if `cooperative`.
pub(crate) fn launch_cluster_cmd(
    f: &Function,
    dims: Dims,
    cluster: [u32; 3],
    cooperative: bool,
    params: &[u8],
) -> Result<VgpuCmd> {
    let entry = abi::entry_function(f.handle, cluster);
    let mut cmd = launch_entry_cmd(f.module, entry, dims, params)?;
    cmd.flags = sys::CMD_LAUNCH_FUNCTION;
    if cooperative {
        cmd.flags |= sys::CMD_LAUNCH_COOPERATIVE;
    }
    Ok(cmd)
}

fn launch_entry_cmd(
    module: u64,
    name: [u8; sys::ENTRY_NAME_LEN],
    dims: Dims,
    params: &[u8],
) -> Result<VgpuCmd> {
    if params.len() > sys::MAX_PARAMS_BYTES as usize {
        return Err(Error::TooBig);
    }
    Ok(VgpuCmd::launch(sys::VgpuLaunchArgs {
        module,
        grid: dims.grid,
        block: dims.block,
        shared_mem: dims.shared_mem,
        params_size: params.len() as u32,
        params: if params.is_empty() {
            0
        } else {
            params.as_ptr() as u64
        },
        entry: name,
    }))
}

/// An entry point of a loaded module, as the device describes it
/// ([`Device::function`]). Valid while its module is loaded.
///
/// [`Device::function`]: crate::Device::function
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Function {
    /// The module's handle.
    pub module: u64,
    /// The device's function handle.
    pub handle: u64,
    /// Its attributes.
    pub info: abi::FuncInfo,
    /// Its parameters in order (offset, size).
    pub params: Vec<abi::FuncParam>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_linear_dims() {
        assert_eq!(Dims::linear(0).grid, [1, 1, 1]);
        assert_eq!(Dims::linear(256).grid, [1, 1, 1]);
        assert_eq!(Dims::linear(257).grid, [2, 1, 1]);
        assert_eq!(Dims::linear(u64::MAX).grid[0], i32::MAX as u32);
    }

    #[test]
    fn test_launch_cmd_encodes_entry_and_params() {
        let p = vgpu_abi::SaxpyParams {
            y: 1,
            x: 2,
            n: 3,
            a: 2.0,
            reserved: 0,
        };
        let c = launch_cmd(0, "saxpy_f32", p.dims(), p.as_slice()).unwrap();
        assert_eq!(c.opcode, sys::CMD_LAUNCH);
        // SAFETY: built as a launch.
        let l = unsafe { c.args.launch };
        assert_eq!(l.params_size, 32);
        assert_eq!(l.params, p.as_slice().as_ptr() as u64);
        assert_eq!(&l.entry[..10], b"saxpy_f32\0");
        assert!(launch_cmd(0, "", Dims::default(), &[]).is_err());
        let over = vec![0; sys::MAX_PARAMS_BYTES as usize + 1];
        assert!(matches!(
            launch_cmd(0, "x", Dims::default(), &over),
            Err(Error::TooBig)
        ));
        let most = vec![0; sys::MAX_PARAMS_BYTES as usize];
        assert!(launch_cmd(0, "x", Dims::default(), &most).is_ok());
    }

    #[test]
    fn test_cooperative_launches_carry_the_flag() {
        let f = Function {
            module: 3,
            handle: 9,
            info: abi::FuncInfo::default(),
            params: Vec::new(),
        };
        let plain = launch_cluster_cmd(&f, Dims::default(), [1, 1, 1], false, &[]).unwrap();
        assert_eq!(plain.flags, sys::CMD_LAUNCH_FUNCTION);
        let coop = launch_cluster_cmd(&f, Dims::default(), [2, 1, 1], true, &[]).unwrap();
        assert_eq!(
            coop.flags,
            sys::CMD_LAUNCH_FUNCTION | sys::CMD_LAUNCH_COOPERATIVE
        );
        // SAFETY: built as a launch.
        let l = unsafe { coop.args.launch };
        assert_eq!(l.module, 3);
        assert_eq!(abi::parse_entry_function(&l.entry), Some((9, [2, 1, 1])));
    }

    #[test]
    fn test_sgemm_dims_cover_c() {
        let p = vgpu_abi::SgemmParams {
            m: 100,
            n: 33,
            k: 7,
            ..Default::default()
        };
        let d = p.dims();
        assert!(d.grid[0] * d.block[0] >= 33);
        assert!(d.grid[1] * d.block[1] >= 100);
        assert!(d.block.iter().product::<u32>() <= 1024);
    }
}
