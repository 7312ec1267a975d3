//! Cooperative launches (ABI 1.5, LAUNCH flag bit 1): offered where the
//! partition runs them, sized by OCCUPANCY, in order with the queue's
//! other commands.

mod common;

use common::*;
use vgpu_backend::conformance;
use vgpu_backend::software::SoftwareBackend;
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::{fill_chain, launch_cmd, Chain, Guest, Mode};

const THREADS: u32 = 64;

/// `grid_rotate(a, b, c)` of the corpus over `blocks` blocks: the module,
/// the launch (flags still 0) and its parameters, and `c`.
fn grid_rotate(g: &mut Guest, blocks: u32) -> (abi::LaunchCmd, Vec<u8>, u64) {
    let m = g.module_load(
        0,
        abi::MODULE_FORMAT_PTX,
        &conformance::portable(conformance::GRID_SYNC_PTX),
    );
    assert_status(m, abi::STATUS_OK);
    let bytes = u64::from(blocks * THREADS) * 4;
    let [a, b, c] = [(); 3].map(|_| g.device_alloc(0, bytes));
    let params = conformance::Params::default().u64(a).u64(b).u64(c);
    let mut launch = launch_cmd("grid_rotate", [blocks, 1, 1], [THREADS, 1, 1], 24);
    launch.module = m.result;
    (launch, params.0, c)
}

/// Checks what `grid_rotate` wrote over `n` threads.
fn check_rotated(g: &mut Guest, c: u64, n: usize) {
    let got = g.download(0, c, n * 4);
    for i in 0..n {
        let v = i32::from_le_bytes(got[i * 4..i * 4 + 4].try_into().unwrap());
        let j = (i + 2 * THREADS as usize) % n;
        assert_eq!(v, (j * 3 + 1) as i32 + 1000, "thread {i}");
    }
}

#[test]
fn a_cooperative_grid_syncs_and_is_sized_by_occupancy() {
    let (_s, mut g) = vgpu_ready();
    assert_ne!(
        g.read64(abi::REG_FEATURES) & abi::FEATURE_COOPERATIVE,
        0,
        "the software partition offers cooperative launches"
    );
    // Two compute units: two blocks are resident at once.
    let (mut launch, params, c) = grid_rotate(&mut g, 2);
    launch.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE;
    assert_status(g.launch_raw(0, &launch, &params), abi::STATUS_OK);
    check_rotated(&mut g, c, 2 * THREADS as usize);
    // By function handle too.
    let out = g.device_alloc(0, 4096);
    let handle = g.func_info(0, launch.module, "grid_rotate", out, 4096);
    assert_status(handle, abi::STATUS_OK);
    let mut by_handle = launch;
    by_handle.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE | abi::LAUNCH_FLAG_FUNCTION;
    by_handle.entry = abi::entry_function(handle.result, [0; 3]);
    g.fill(0, c, 2 * u64::from(THREADS) * 4, 0);
    assert_status(g.launch_raw(0, &by_handle, &params), abi::STATUS_OK);
    check_rotated(&mut g, c, 2 * THREADS as usize);
    // A block more than fits: INVALID, and nothing ran.
    g.fill(0, c, 2 * u64::from(THREADS) * 4, 0);
    let mut large = launch;
    large.grid = [3, 1, 1];
    assert_status(g.launch_raw(0, &large, &params), abi::STATUS_INVALID);
    assert_eq!(g.download(0, c, 8), [0; 8]);
    let mut large = by_handle;
    large.grid = [1, 3, 1];
    assert_status(g.launch_raw(0, &large, &params), abi::STATUS_INVALID);
    // Without the flag grid.sync() has nothing to count with: the kernel
    // traps, as outside a cooperative launch on a GPU.
    let mut plain = launch;
    plain.hdr.flags = 0;
    assert_ne!(g.launch_raw(0, &plain, &params).status, abi::STATUS_OK);
    // Flags past those the ABI defines.
    let mut unknown = launch;
    unknown.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE | 1 << 2;
    assert_status(g.launch_raw(0, &unknown, &params), abi::STATUS_INVALID);
    // The built-in kernels are not launched cooperatively.
    let mut builtin = launch_cmd("fill_u32", [1, 1, 1], [64, 1, 1], 16);
    builtin.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE;
    let fill = conformance::Params::default().u64(out).u32(0).u32(4);
    assert_status(g.launch_raw(0, &builtin, &fill.0), abi::STATUS_INVALID);
}

#[test]
fn a_cooperative_launch_runs_in_order_with_its_queue() {
    let (_s, mut g) = vgpu_ready();
    let (mut launch, params, c) = grid_rotate(&mut g, 2);
    launch.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE;
    let bytes = 2 * u64::from(THREADS) * 4;
    let coop = Chain::command(&launch).bytes(&params).completion();
    // The launch after a fill overwrites it; a fill after the launch
    // overwrites the launch's results.
    let used = g.submit_batch(0, &[fill_chain(c, bytes, 0x5a5a_5a5a), coop.clone()]);
    assert!(used.iter().all(|u| u.completion().status == abi::STATUS_OK));
    check_rotated(&mut g, c, 2 * THREADS as usize);
    let used = g.submit_batch(0, &[coop, fill_chain(c, bytes, 0x5a5a_5a5a)]);
    assert!(used.iter().all(|u| u.completion().status == abi::STATUS_OK));
    assert_eq!(g.download(0, c, 8), [0x5a; 8]);
}

#[test]
fn a_partition_without_cooperative_launches_refuses_them() {
    let backend = SoftwareBackend::new(16 * MIB, 2);
    let inner = vgpu_device::testing::software_partition(&backend, "plain", 16 * MIB, 2);
    // A wrapper that does not forward Partition::cooperative hides it.
    let p = Faulting {
        inner,
        lost: false,
        resets: Default::default(),
    };
    let server = TestVgpu::start(test_config("plain", 2), Box::new(p));
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_eq!(g.read64(abi::REG_FEATURES) & abi::FEATURE_COOPERATIVE, 0);
    let (mut launch, params, _) = grid_rotate(&mut g, 1);
    launch.hdr.flags = abi::LAUNCH_FLAG_COOPERATIVE;
    assert_status(g.launch_raw(0, &launch, &params), abi::STATUS_UNSUPPORTED);
}
