//! What a vGPU reports of itself: its compute capability and device
//! attributes, as a GPU of that capability reports them.

use vgpu_guest::vgpu_abi as abi;

use crate::cu::{self, CuResult};
use crate::state::Gpu;

pub use crate::cu::{CC_MAJOR, CC_MINOR};

/// L2 cache, as a Hopper-class GPU has.
pub const L2_BYTES: usize = 50 << 20;
/// The most of it that may be set aside for persisting accesses
/// (`cuCtxSetLimit`'s `CU_LIMIT_PERSISTING_L2_CACHE_SIZE`): five eighths,
/// as an H100 reports.
pub const MAX_PERSISTING_L2_BYTES: usize = L2_BYTES / 8 * 5;
/// The largest L2 access policy window a stream or launch may carry.
pub const MAX_ACCESS_POLICY_WINDOW_BYTES: u64 = 128 << 20;

/// The value of device attribute `attr`, as a GPU of this capability
/// reports it; features a vGPU lacks (concurrent managed access, peer access,
/// textures, ...) read 0, as on a GPU without them.
pub fn attribute(g: &Gpu, attr: i32) -> CuResult<i32> {
    let sms = i32::try_from(g.info.compute_units.max(1)).unwrap_or(i32::MAX);
    if let Some(v) = texture_limit(g, attr) {
        return Ok(v);
    }
    Ok(match attr {
        cu::ATTR_MAX_THREADS_PER_BLOCK => abi::MAX_BLOCK_THREADS as i32,
        cu::ATTR_MAX_BLOCK_DIM_X => abi::MAX_BLOCK_X as i32,
        cu::ATTR_MAX_BLOCK_DIM_Y => abi::MAX_BLOCK_Y as i32,
        cu::ATTR_MAX_BLOCK_DIM_Z => abi::MAX_BLOCK_Z as i32,
        cu::ATTR_MAX_GRID_DIM_X => abi::MAX_GRID_X as i32,
        cu::ATTR_MAX_GRID_DIM_Y => abi::MAX_GRID_Y as i32,
        cu::ATTR_MAX_GRID_DIM_Z => abi::MAX_GRID_Z as i32,
        cu::ATTR_MAX_SHARED_MEMORY_PER_BLOCK => 48 << 10,
        // What a kernel may opt in to (cuFuncSetAttribute), as on a
        // Hopper GPU; the host's driver enforces its own limit again.
        cu::ATTR_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 227 << 10,
        cu::ATTR_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 << 10,
        cu::ATTR_RESERVED_SHARED_MEMORY_PER_BLOCK => 1 << 10,
        cu::ATTR_TOTAL_CONSTANT_MEMORY => 64 << 10,
        cu::ATTR_WARP_SIZE => 32,
        cu::ATTR_MAX_PITCH => i32::MAX,
        cu::ATTR_MAX_REGISTERS_PER_BLOCK | cu::ATTR_MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
        cu::ATTR_CLOCK_RATE => 1_755_000,
        cu::ATTR_MEMORY_CLOCK_RATE => 2_619_000,
        cu::ATTR_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        cu::ATTR_L2_CACHE_SIZE => L2_BYTES as i32,
        // Persisting accesses and access policy windows are hints the
        // device honours by ignoring them; their bounds are checked.
        cu::ATTR_MAX_PERSISTING_L2_CACHE_SIZE => MAX_PERSISTING_L2_BYTES as i32,
        cu::ATTR_MAX_ACCESS_POLICY_WINDOW_SIZE => MAX_ACCESS_POLICY_WINDOW_BYTES as i32,
        cu::ATTR_TEXTURE_ALIGNMENT | cu::ATTR_SURFACE_ALIGNMENT => 512,
        cu::ATTR_TEXTURE_PITCH_ALIGNMENT => 32,
        cu::ATTR_GPU_OVERLAP | cu::ATTR_CONCURRENT_KERNELS => 1,
        cu::ATTR_ASYNC_ENGINE_COUNT => 1,
        cu::ATTR_MULTIPROCESSOR_COUNT => sms,
        cu::ATTR_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        cu::ATTR_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        cu::ATTR_CAN_MAP_HOST_MEMORY => 0,
        cu::ATTR_UNIFIED_ADDRESSING => 1,
        // Managed memory without concurrent access (crate::managed): the
        // host uses it while the device is idle.
        cu::ATTR_MANAGED_MEMORY => 1,
        // Stream-ordered allocations and their pools (crate::pool_table);
        // none exports handles (MEMPOOL_SUPPORTED_HANDLE_TYPES 0).
        cu::ATTR_MEMORY_POOLS_SUPPORTED => 1,
        // Virtual memory management (crate::vmm), where the vGPU and its
        // kernel driver offer it; its physical allocations export as
        // POSIX file descriptors (within the process). Compression and
        // GPUDirect RDMA read 0 below.
        cu::ATTR_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
        | cu::ATTR_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => {
            i32::from(g.info.flags & vgpu_guest::sys::INFO_VMM != 0)
        }
        cu::ATTR_GENERIC_COMPRESSION_SUPPORTED
        | cu::ATTR_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED => 0,
        cu::ATTR_PCI_DOMAIN_ID => g.info.pci_domain as i32,
        cu::ATTR_PCI_BUS_ID => i32::from(g.info.pci_bus),
        cu::ATTR_PCI_DEVICE_ID => i32::from(g.info.pci_devfn >> 3),
        cu::ATTR_GPU_PCI_SUBSYSTEM_ID => {
            (i32::from(g.info.subsystem_id) << 16) | i32::from(g.info.subsystem_vendor_id)
        }
        cu::ATTR_COMPUTE_CAPABILITY_MAJOR => CC_MAJOR,
        cu::ATTR_COMPUTE_CAPABILITY_MINOR => CC_MINOR,
        cu::ATTR_STREAM_PRIORITIES_SUPPORTED => 1,
        cu::ATTR_GLOBAL_L1_CACHE_SUPPORTED | cu::ATTR_LOCAL_L1_CACHE_SUPPORTED => 1,
        cu::ATTR_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        cu::ATTR_COMPUTE_PREEMPTION_SUPPORTED => 1,
        cu::ATTR_CLUSTER_LAUNCH => 1,
        // Where the device runs them (grid.sync() needs the grid
        // resident at once).
        cu::ATTR_COOPERATIVE_LAUNCH => {
            i32::from(g.info.features & vgpu_guest::sys::FEATURE_COOPERATIVE != 0)
        }
        // cuMemHostRegister works on any host range (copies read it in
        // place).
        cu::ATTR_HOST_REGISTER_SUPPORTED => 1,
        // Stream memory operations, 64-bit words and NOR included, on
        // page-locked host memory (the stream memory operations).
        cu::ATTR_CAN_USE_STREAM_MEM_OPS_V1
        | cu::ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS_V1
        | cu::ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR_V1
        | cu::ATTR_CAN_USE_64_BIT_STREAM_MEM_OPS
        | cu::ATTR_CAN_USE_STREAM_WAIT_VALUE_NOR => 1,
        cu::ATTR_NUMA_ID | cu::ATTR_HOST_NUMA_ID => -1,
        a if (1..cu::ATTR_END).contains(&a) => 0,
        _ => return Err(cu::ERROR_INVALID_VALUE),
    })
}

/// The texture and surface limits of a vGPU with CUDA arrays (the
/// device's, which every GPU since compute capability 5.0 meets; 0
/// without arrays, and for mipmaps and gathers, which it does not have);
/// `None` for other attributes.
fn texture_limit(g: &Gpu, attr: i32) -> Option<i32> {
    use vgpu_guest::sys;
    let (d1, d2, d3, layers) = (
        abi::MAX_ARRAY_1D as i32,
        abi::MAX_ARRAY_2D as i32,
        abi::MAX_ARRAY_3D as i32,
        abi::MAX_ARRAY_LAYERS as i32,
    );
    let v = match attr {
        cu::ATTR_MAXIMUM_TEXTURE1D_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURE1D_LAYERED_WIDTH
        | cu::ATTR_MAXIMUM_SURFACE1D_WIDTH
        | cu::ATTR_MAXIMUM_SURFACE1D_LAYERED_WIDTH => d1,
        cu::ATTR_MAXIMUM_TEXTURE2D_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURE2D_HEIGHT
        | cu::ATTR_MAXIMUM_SURFACE2D_WIDTH
        | cu::ATTR_MAXIMUM_SURFACE2D_HEIGHT
        | cu::ATTR_MAXIMUM_TEXTURE2D_LINEAR_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURE2D_LINEAR_HEIGHT => d2,
        cu::ATTR_MAXIMUM_TEXTURE3D_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURE3D_HEIGHT
        | cu::ATTR_MAXIMUM_TEXTURE3D_DEPTH
        | cu::ATTR_MAXIMUM_TEXTURE2D_LAYERED_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURE2D_LAYERED_HEIGHT
        | cu::ATTR_MAXIMUM_SURFACE3D_WIDTH
        | cu::ATTR_MAXIMUM_SURFACE3D_HEIGHT
        | cu::ATTR_MAXIMUM_SURFACE3D_DEPTH
        | cu::ATTR_MAXIMUM_SURFACE2D_LAYERED_WIDTH
        | cu::ATTR_MAXIMUM_SURFACE2D_LAYERED_HEIGHT => d3,
        cu::ATTR_MAXIMUM_TEXTURECUBEMAP_WIDTH
        | cu::ATTR_MAXIMUM_TEXTURECUBEMAP_LAYERED_WIDTH
        | cu::ATTR_MAXIMUM_SURFACECUBEMAP_WIDTH
        | cu::ATTR_MAXIMUM_SURFACECUBEMAP_LAYERED_WIDTH => abi::MAX_ARRAY_CUBEMAP as i32,
        // In faces, as CUDA bounds a layered cubemap's depth.
        cu::ATTR_MAXIMUM_TEXTURECUBEMAP_LAYERED_LAYERS
        | cu::ATTR_MAXIMUM_SURFACECUBEMAP_LAYERED_LAYERS => abi::MAX_CUBEMAP_FACES as i32,
        cu::ATTR_MAXIMUM_TEXTURE2D_LAYERED_LAYERS
        | cu::ATTR_MAXIMUM_TEXTURE1D_LAYERED_LAYERS
        | cu::ATTR_MAXIMUM_SURFACE1D_LAYERED_LAYERS
        | cu::ATTR_MAXIMUM_SURFACE2D_LAYERED_LAYERS => layers,
        // 2^27 elements, as every GPU since compute capability 3.0.
        cu::ATTR_MAXIMUM_TEXTURE1D_LINEAR_WIDTH => 1 << 27,
        cu::ATTR_MAXIMUM_TEXTURE2D_LINEAR_PITCH => (1 << 21) - 32,
        _ => return None,
    };
    let arrays =
        g.info.features & sys::FEATURE_ARRAYS != 0 && g.info.flags & sys::INFO_CONTEXTS != 0;
    Some(if arrays { v } else { 0 })
}

/// Checks an L2 access policy window (`CUaccessPolicyWindow`, as a
/// launch attribute value holds it): no larger than the device allows,
/// its hit ratio a fraction.
pub fn check_access_policy_window(v: &cu::CUlaunchAttributeValue) -> CuResult {
    let bytes = u64::from(v[2]) | (u64::from(v[3]) << 32);
    let ratio = f32::from_bits(v[4]);
    if bytes > MAX_ACCESS_POLICY_WINDOW_BYTES || !(0.0..=1.0).contains(&ratio) {
        return Err(cu::ERROR_INVALID_VALUE);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_policy_windows_are_bounded() {
        let window = |bytes: u64, ratio: f32| {
            let mut v = [0u32; 16];
            v[2] = bytes as u32;
            v[3] = (bytes >> 32) as u32;
            v[4] = ratio.to_bits();
            check_access_policy_window(&v)
        };
        assert_eq!(window(1 << 20, 0.6), Ok(()));
        assert_eq!(window(MAX_ACCESS_POLICY_WINDOW_BYTES, 1.0), Ok(()));
        assert_eq!(window(1 << 40, 0.6), Err(cu::ERROR_INVALID_VALUE));
        assert_eq!(window(1 << 20, 1.5), Err(cu::ERROR_INVALID_VALUE));
    }
}
