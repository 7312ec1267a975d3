//! Contexts (ABI 1.5): each guest process's device state in a partition
//! of its own behind one function. Memory and modules are a context's
//! own, the quota is shared, a kernel fault ends its context alone (no
//! STATUS.FATAL, nothing logged, the others go on), and CTX_DESTROY gives
//! everything of a context back.

mod common;

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use common::{assert_status, fill_count, Faulting, MIB, POISON};
use vgpu_backend::conformance;
use vgpu_backend::contexts::{ContextFactory, Contexts};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, Partition};
use vgpu_device::testing::{software_partition, test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::{bare_chain, Guest, Mode};

const MEMORY: u64 = 16 * MIB;

/// A function whose contexts (at most `max`) are software partitions
/// that lose their state on a poisoned launch, and a guest with queue 0
/// set up.
fn vgpu(max: u32) -> (TestVgpu, Guest) {
    vgpu_costing(max, 0)
}

/// As [`vgpu`], each context holding `cost` bytes of its own.
fn vgpu_costing(max: u32, cost: u64) -> (TestVgpu, Guest) {
    let backend = Arc::new(SoftwareBackend::new(MEMORY, 2));
    let base = software_partition(&backend, "ctx", MEMORY, 2);
    let make: ContextFactory = Box::new(move |spec| {
        Ok(Box::new(Faulting {
            inner: backend.create_context(spec)?,
            lost: false,
            resets: Arc::new(AtomicU32::new(0)),
        }) as Box<dyn Partition>)
    });
    let p = Contexts::new(base, make, max).with_cost(cost);
    let server = TestVgpu::start(test_config("ctx", 2), Box::new(p));
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    (server, g)
}

fn destroy(g: &mut Guest, ctx: u32) -> abi::Completion {
    g.set_context(ctx);
    let c = g.run(0, &bare_chain(abi::OP_CTX_DESTROY));
    g.set_context(0);
    c
}

fn words(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
        .collect()
}

#[test]
fn contexts_are_offered_and_counted() {
    let (_s, mut g) = vgpu(4);
    assert_ne!(g.read64(abi::REG_FEATURES) & abi::FEATURE_CONTEXTS, 0);
    assert_eq!(g.read32(abi::REG_MAX_CONTEXTS), 4);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 0);
    // Commands that need no device state make no context.
    g.set_context(3);
    let flag = g.alloc(8, 8);
    assert_status(g.fence(0, flag, 1, 0), abi::STATUS_OK);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 0);
    // The first one that does, does.
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 1);
    // Context 0 is the function's own: it cannot be ended.
    assert_status(destroy(&mut g, 0), abi::STATUS_INVALID);
    assert_status(destroy(&mut g, 3), abi::STATUS_OK);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 0);
    // Ending one that does not exist is no error.
    assert_status(destroy(&mut g, 3), abi::STATUS_OK);
}

#[test]
fn a_contexts_own_memory_is_shown_and_counted_from_its_first_command() {
    let (_s, mut g) = vgpu_costing(4, 3 * MIB);
    assert_eq!(g.read64(abi::REG_CONTEXT_COST), 3 * MIB);
    assert_eq!(g.read64(abi::REG_MEM_USED), 0);
    g.set_context(1);
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_eq!(g.read64(abi::REG_MEM_USED), 3 * MIB);
    // What a context may allocate is the quota less what each holds.
    let past = g.mem_alloc(0, MEMORY - 3 * MIB + 4096, 0);
    assert_status(past, abi::STATUS_NO_MEMORY);
    let a = g.device_alloc(0, MEMORY - 3 * MIB);
    // A second context does not fit beside it.
    g.set_context(2);
    assert_status(g.nop(0), abi::STATUS_NO_MEMORY);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 1);
    g.set_context(1);
    assert_status(g.mem_free(0, a), abi::STATUS_OK);
    assert_status(destroy(&mut g, 1), abi::STATUS_OK);
    assert_eq!(g.read64(abi::REG_MEM_USED), 0);
    // Without a cost the register reads 0.
    let (_s0, mut g0) = vgpu(4);
    assert_eq!(g0.read64(abi::REG_CONTEXT_COST), 0);
}

#[test]
fn each_context_has_its_own_memory_within_the_shared_quota() {
    let (_s, mut g) = vgpu(4);
    g.set_context(1);
    let a = g.device_alloc(0, 8 * MIB);
    assert_status(g.fill(0, a, 8 * MIB, 0x1111_1111), abi::STATUS_OK);
    g.set_context(2);
    let b = g.device_alloc(0, 4 * MIB);
    // Context 1's memory is not context 2's: a range past the end of
    // context 2's allocation, inside context 1's, is outside every
    // allocation there (the two may start at the same address).
    let sg = g.alloc_sg(&[4096]);
    let beyond = g.copy_from_device(0, a + 6 * MIB, &sg);
    assert_status(beyond, abi::STATUS_OUT_OF_RANGE);
    // Together they stay within the function's quota.
    let past = g.mem_alloc(0, 8 * MIB, 0);
    assert_status(past, abi::STATUS_NO_MEMORY);
    assert_eq!(g.read64(abi::REG_MEM_USED), 12 * MIB);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 2);
    // What context 1 wrote is intact.
    g.set_context(1);
    let back = g.download(0, a, 4096);
    assert!(words(&back).iter().all(|&w| w == 0x1111_1111));
    // Ending a context gives its memory back.
    assert_status(destroy(&mut g, 1), abi::STATUS_OK);
    assert_eq!(g.read64(abi::REG_MEM_USED), 4 * MIB);
    g.set_context(2);
    assert_status(g.mem_free(0, b), abi::STATUS_OK);
}

#[test]
fn module_handles_name_one_context() {
    let (_s, mut g) = vgpu(4);
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    g.set_context(1);
    let module = g.module_load(0, abi::MODULE_FORMAT_PTX, &ptx);
    assert_status(module, abi::STATUS_OK);
    let out = g.device_alloc(0, 4096);
    assert_status(
        g.func_info(0, module.result, "vector_add", out, 4096),
        abi::STATUS_OK,
    );
    g.set_context(2);
    let out2 = g.device_alloc(0, 4096);
    assert_status(
        g.func_info(0, module.result, "vector_add", out2, 4096),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(g.module_unload(0, module.result), abi::STATUS_NOT_FOUND);
    // The same image in context 2 is a module of its own.
    let mine = g.module_load(0, abi::MODULE_FORMAT_PTX, &ptx);
    assert_status(mine, abi::STATUS_OK);
    assert_ne!(mine.result, module.result);
    g.set_context(1);
    assert_status(g.module_unload(0, module.result), abi::STATUS_OK);
}

#[test]
fn a_fault_ends_its_context_alone_and_nothing_is_left_behind() {
    let (_s, mut g) = vgpu(4);
    g.set_context(2);
    let b = g.device_alloc(0, MIB);
    assert_status(g.fill(0, b, MIB, 0x2222_2222), abi::STATUS_OK);
    let used = g.read64(abi::REG_MEM_USED);
    let errors = g.error_count();
    for round in 0..20u32 {
        g.set_context(1);
        let a = g.device_alloc(0, 2 * MIB);
        assert_status(fill_count(&mut g, a, 16), abi::STATUS_OK);
        // The faulting launch says what happened; its context is gone.
        assert_status(fill_count(&mut g, a, POISON), abi::STATUS_KERNEL_FAULT);
        assert_eq!(
            g.read32(abi::REG_STATUS) & abi::STATUS_FATAL,
            0,
            "round {round}: the function goes on"
        );
        assert_status(fill_count(&mut g, a, 16), abi::STATUS_CONTEXT_LOST);
        assert_status(g.timestamp(0), abi::STATUS_CONTEXT_LOST);
        assert_status(g.mem_alloc(0, 4096, 0), abi::STATUS_CONTEXT_LOST);
        // Its memory went with it.
        assert_eq!(g.read64(abi::REG_MEM_USED), used, "round {round}");
        // The other context never noticed.
        g.set_context(2);
        assert_status(fill_count(&mut g, b, 1024), abi::STATUS_OK);
        let back = g.download(0, b, 8192);
        let w = words(&back);
        assert!(w[..1024].iter().all(|&x| x == 9), "round {round}");
        assert!(w[1024..].iter().all(|&x| x == 0x2222_2222), "round {round}");
        // The driver ends the lost context; its number is free again.
        assert_status(destroy(&mut g, 1), abi::STATUS_OK);
        assert_eq!(g.read32(abi::REG_CONTEXTS), 1);
    }
    assert_eq!(g.error_count(), errors, "a context's fault logs no error");
}

#[test]
fn contexts_past_the_limit_are_refused_until_one_ends() {
    let (_s, mut g) = vgpu(2);
    for ctx in [1, 2] {
        g.set_context(ctx);
        g.device_alloc(0, MIB);
    }
    g.set_context(3);
    assert_status(g.mem_alloc(0, MIB, 0), abi::STATUS_NO_MEMORY);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 2);
    // A lost context counts until it is ended.
    g.set_context(2);
    let a = g.device_alloc(0, MIB);
    assert_status(fill_count(&mut g, a, POISON), abi::STATUS_KERNEL_FAULT);
    g.set_context(3);
    assert_status(g.mem_alloc(0, MIB, 0), abi::STATUS_NO_MEMORY);
    assert_status(destroy(&mut g, 2), abi::STATUS_OK);
    g.set_context(3);
    assert_status(g.mem_alloc(0, MIB, 0), abi::STATUS_OK);
}

#[test]
fn a_reset_ends_every_context() {
    let (_s, mut g) = vgpu(4);
    for ctx in [1, 2, 3] {
        g.set_context(ctx);
        g.device_alloc(0, MIB);
    }
    assert_eq!(g.read32(abi::REG_CONTEXTS), 3);
    g.control_reset();
    g.enable_device();
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_eq!(g.read32(abi::REG_CONTEXTS), 0);
    assert_eq!(g.read64(abi::REG_MEM_USED), 0);
}

#[test]
fn a_function_without_contexts_refuses_them() {
    let backend = SoftwareBackend::new(MEMORY, 2);
    let p = software_partition(&backend, "plain", MEMORY, 2);
    let server = TestVgpu::start(test_config("plain", 1), p);
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    assert_eq!(g.read64(abi::REG_FEATURES) & abi::FEATURE_CONTEXTS, 0);
    assert_eq!(g.read32(abi::REG_MAX_CONTEXTS), 0);
    g.set_context(1);
    assert_status(g.mem_alloc(0, 4096, 0), abi::STATUS_UNSUPPORTED);
    assert_status(destroy(&mut g, 1), abi::STATUS_UNSUPPORTED);
    g.set_context(0);
    assert_status(g.mem_alloc(0, 4096, 0), abi::STATUS_OK);
}
