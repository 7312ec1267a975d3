//! Virtual memory management (ABI 1.6, FEATURES bit 10): VA_RESERVE,
//! MEM_CREATE, MEM_MAP and MEM_ACCESS through the queues, on the software
//! backend: mapped memory reached by COPY, FILL and kernels, the quota
//! charged by physical allocations, malformed commands refused, and each
//! context's reservations its own.

mod common;

use std::sync::Arc;

use common::*;
use vgpu_backend::contexts::{ContextFactory, Contexts};
use vgpu_backend::software::SoftwareBackend;
use vgpu_backend::{Backend, Partition};
use vgpu_device::testing::{test_config, TestVgpu};
use vgpu_testkit::abi;
use vgpu_testkit::{bare_chain, Guest, Mode};

const G: u64 = abi::VMM_GRANULARITY;

fn reserve(g: &mut Guest, size: u64, align: u64, addr: u64) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::VaCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_VA_RESERVE,
                flags: 0,
            },
            addr,
            size,
            align,
        },
    )
}

fn free(g: &mut Guest, addr: u64, size: u64) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::VaCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_VA_RESERVE,
                flags: abi::VA_FLAG_FREE,
            },
            addr,
            size,
            align: 0,
        },
    )
}

fn create(g: &mut Guest, flags: u32, size: u64, handle: u64) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::MemCreateCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_MEM_CREATE,
                flags,
            },
            size,
            handle,
        },
    )
}

fn map(g: &mut Guest, flags: u32, addr: u64, size: u64, handle: u64) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::MemMapCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_MEM_MAP,
                flags,
            },
            addr,
            size,
            handle,
            offset: 0,
        },
    )
}

fn access(g: &mut Guest, addr: u64, size: u64, access: u32) -> abi::Completion {
    g.run_cmd(
        0,
        &abi::MemAccessCmd {
            hdr: abi::CmdHeader {
                opcode: abi::OP_MEM_ACCESS,
                flags: 0,
            },
            addr,
            size,
            access,
            reserved: 0,
        },
    )
}

#[test]
fn mapped_memory_is_reached_by_copies_fills_and_the_quota() {
    let (_s, mut g) = vgpu_ready();
    assert_ne!(g.read64(abi::REG_FEATURES) & abi::FEATURE_VMM, 0);
    assert!(
        g.read32(abi::REG_VERSION) & 0xffff >= 6,
        "VMM came with ABI 1.6"
    );
    let r = reserve(&mut g, 16 * G, 0, 0);
    assert_status(r, abi::STATUS_OK);
    let base = r.result;
    assert_eq!(base % G, 0);
    assert_eq!(g.mem_used(), 0, "a reservation costs nothing");
    let [h1, h2] = [0; 2].map(|_| {
        let c = create(&mut g, 0, G, 0);
        assert_status(c, abi::STATUS_OK);
        c.result
    });
    assert_eq!(g.mem_used(), 2 * G);
    assert_status(map(&mut g, 0, base, G, h1), abi::STATUS_OK);
    assert_status(map(&mut g, 0, base + G, G, h2), abi::STATUS_OK);
    // No access yet: COPY does not reach it.
    assert_status(g.fill(0, base, 64, 1), abi::STATUS_OUT_OF_RANGE);
    assert_status(
        access(&mut g, base, 2 * G, abi::MEM_ACCESS_READ_WRITE),
        abi::STATUS_OK,
    );
    let data = Rng(0x5eed_0b01).bytes(8192);
    g.upload(0, base + G - 4096, &data);
    assert_eq!(g.download(0, base + G - 4096, 8192), data);
    // The first allocation again at another address: the same bytes.
    assert_status(map(&mut g, 0, base + 8 * G, G, h1), abi::STATUS_OK);
    assert_status(
        access(&mut g, base + 8 * G, G, abi::MEM_ACCESS_READ_WRITE),
        abi::STATUS_OK,
    );
    assert_eq!(g.download(0, base + 9 * G - 4096, 4096), data[..4096]);
    // Refused: a double map, a misaligned one, a partial unmap.
    assert_status(map(&mut g, 0, base, G, h2), abi::STATUS_INVALID);
    assert_status(
        map(&mut g, 0, base + 2 * G + 4096, G, h2),
        abi::STATUS_INVALID,
    );
    assert_status(
        map(&mut g, abi::MEM_MAP_FLAG_UNMAP, base, G / 2, 0),
        abi::STATUS_INVALID,
    );
    assert_status(free(&mut g, base, 16 * G), abi::STATUS_INVALID);
    // Unmapped and released: the quota is back.
    assert_status(
        map(&mut g, abi::MEM_MAP_FLAG_UNMAP, base, 2 * G, 0),
        abi::STATUS_OK,
    );
    assert_status(
        map(&mut g, abi::MEM_MAP_FLAG_UNMAP, base + 8 * G, G, 0),
        abi::STATUS_OK,
    );
    for h in [h1, h2] {
        assert_status(
            create(&mut g, abi::MEM_CREATE_FLAG_RELEASE, 0, h),
            abi::STATUS_OK,
        );
    }
    assert_status(
        create(&mut g, abi::MEM_CREATE_FLAG_RELEASE, 0, h1),
        abi::STATUS_NOT_FOUND,
    );
    assert_eq!(g.mem_used(), 0);
    assert_status(free(&mut g, base, 16 * G), abi::STATUS_OK);
}

#[test]
fn malformed_virtual_memory_commands_are_invalid() {
    let (_s, mut g) = vgpu_ready();
    assert_status(reserve(&mut g, 0, 0, 0), abi::STATUS_INVALID);
    assert_status(reserve(&mut g, G + 1, 0, 0), abi::STATUS_INVALID);
    assert_status(reserve(&mut g, G, 3, 0), abi::STATUS_INVALID);
    assert_status(reserve(&mut g, 1 << 45, 0, 0), abi::STATUS_INVALID);
    assert_status(create(&mut g, 0, 0, 0), abi::STATUS_INVALID);
    assert_status(create(&mut g, 0, 4096, 0), abi::STATUS_INVALID);
    assert_status(create(&mut g, 0, G, 5), abi::STATUS_INVALID);
    assert_status(create(&mut g, 0, MEMORY + G, 0), abi::STATUS_NO_MEMORY);
    assert_status(create(&mut g, 1 << 5, G, 0), abi::STATUS_INVALID);
    assert_status(map(&mut g, 1 << 3, 0, G, 1), abi::STATUS_INVALID);
    assert_status(access(&mut g, 0, G, 7), abi::STATUS_INVALID);
    // A command cut short.
    let short = abi::CmdHeader {
        opcode: abi::OP_MEM_MAP,
        flags: 0,
    };
    assert_status(g.run_cmd(0, &short), abi::STATUS_INVALID);
    // A wanted address that is free is taken.
    let r = reserve(&mut g, 4 * G, 0, 0);
    assert_status(free(&mut g, r.result, 4 * G), abi::STATUS_OK);
    let again = reserve(&mut g, 4 * G, 0, r.result);
    assert_eq!(again.result, r.result);
    // A taken one is not: another address comes back.
    let other = reserve(&mut g, 4 * G, 0, r.result);
    assert_status(other, abi::STATUS_OK);
    assert_ne!(other.result, r.result);
    g.run(0, &bare_chain(abi::OP_NOP));
}

#[test]
fn each_context_has_its_own_reservations_freed_when_it_ends() {
    let backend = Arc::new(SoftwareBackend::new(MEMORY, 2));
    let base = backend
        .create_partition(&vgpu_backend::PartitionSpec {
            name: "vmm".into(),
            memory: MEMORY,
            compute_units: 2,
        })
        .unwrap();
    let make: ContextFactory = Box::new(move |spec| {
        backend
            .create_context(spec)
            .map(|p| p as Box<dyn Partition>)
    });
    let server = TestVgpu::start(
        test_config("vmm", 2),
        Box::new(Contexts::new(base, make, 4)),
    );
    let mut g = server.connect();
    g.setup_queue(0, 64, Mode::Interrupt);
    g.set_context(1);
    let r = reserve(&mut g, 4 * G, 0, 0);
    assert_status(r, abi::STATUS_OK);
    let h = create(&mut g, 0, G, 0);
    assert_status(h, abi::STATUS_OK);
    assert_status(map(&mut g, 0, r.result, G, h.result), abi::STATUS_OK);
    assert_eq!(g.mem_used(), G);
    // Context 2 does not see context 1's.
    g.set_context(2);
    assert_status(
        map(&mut g, 0, r.result + G, G, h.result),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(free(&mut g, r.result, 4 * G), abi::STATUS_INVALID);
    // Physical memory of all contexts shares the quota.
    assert_status(create(&mut g, 0, MEMORY, 0), abi::STATUS_NO_MEMORY);
    g.set_context(1);
    let c = g.run(0, &bare_chain(abi::OP_CTX_DESTROY));
    assert_status(c, abi::STATUS_OK);
    g.set_context(0);
    assert_eq!(g.mem_used(), 0);
}
