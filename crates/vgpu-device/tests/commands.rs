//! Every command's success and failure paths, through a guest driver over a
//! real vfio-user socket, on a software partition.

mod common;

use common::{assert_status, vgpu_ready, vgpu_with_memory, Rng, MIB};
use vgpu_backend::conformance;
use vgpu_testkit::abi::{self, ByteValued, CmdHeader, CopyCmd, SgEntry};
use vgpu_testkit::{
    bare_chain, bytes_to_f32s, f32s_to_bytes, fill_chain, guest_copy_chain, launch_cmd, Chain, Mode,
};

fn copy_cmd(src_kind: u32, dst_kind: u32, src: u64, dst: u64, size: u64, sg_count: u32) -> CopyCmd {
    CopyCmd {
        hdr: CmdHeader {
            opcode: abi::OP_COPY,
            flags: 0,
        },
        src_kind,
        dst_kind,
        src,
        dst,
        size,
        sg_count,
        reserved: 0,
    }
}

#[test]
fn test_nop_completes_with_a_full_completion() {
    let (_s, mut g) = vgpu_ready();
    let used = g.submit(0, &Chain::command(&CmdHeader::default()).completion());
    assert_eq!(used.len, 32, "the device reports the completion bytes");
    let c = used.completion();
    assert_status(c, abi::STATUS_OK);
    assert_eq!((c.result, c.reserved, c.result2), (0, 0, 0));
    assert_eq!(g.commands(), 1);
}

#[test]
fn test_unknown_opcode_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    for op in [10, 0x100, u32::MAX] {
        let c = g.run_cmd(
            0,
            &CmdHeader {
                opcode: op,
                flags: 0,
            },
        );
        assert_status(c, abi::STATUS_INVALID);
    }
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_fence_writes_the_value() {
    let (_s, mut g) = vgpu_ready();
    let addr = g.alloc(64, 8);
    let c = g.fence(0, addr + 8, 0x0123_4567_89ab_cdef, 0);
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.read(addr + 8, 8), 0x0123_4567_89ab_cdefu64.to_le_bytes());
    assert_eq!(g.read(addr, 8), [0; 8], "neighbours untouched");
    assert_eq!(g.read(addr + 16, 8), [0; 8], "neighbours untouched");
}

#[test]
fn test_fence_misaligned_address_is_invalid_and_writes_nothing() {
    let (_s, mut g) = vgpu_ready();
    let addr = g.alloc(64, 8);
    for off in [1, 4, 7] {
        assert_status(g.fence(0, addr + off, u64::MAX, 0), abi::STATUS_INVALID);
    }
    assert_eq!(g.read(addr, 64), vec![0; 64]);
}

#[test]
fn test_fence_unknown_flag_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let addr = g.alloc(8, 8);
    assert_status(g.fence(0, addr, 7, 1 << 1), abi::STATUS_INVALID);
    assert_eq!(g.read(addr, 8), [0; 8]);
}

#[test]
fn test_fence_to_unmapped_address_faults() {
    let (_s, mut g) = vgpu_ready();
    let bad = g.unmapped_addr();
    assert_status(g.fence(0, bad, 1, 0), abi::STATUS_FAULT);
    // Straddling the end of guest RAM.
    let end = g.ram().iova() + g.ram().size();
    assert_status(g.fence(0, end - 8, 1, 0), abi::STATUS_OK);
    // Below guest RAM.
    assert_status(g.fence(0, g.ram().iova() - 8, 1, 0), abi::STATUS_FAULT);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_timestamp_is_monotonic() {
    let (_s, mut g) = vgpu_ready();
    let mut last = 0;
    for _ in 0..20 {
        let c = g.timestamp(0);
        assert_status(c, abi::STATUS_OK);
        assert!(
            c.result >= last,
            "timestamp went back: {} < {last}",
            c.result
        );
        last = c.result;
    }
    std::thread::sleep(std::time::Duration::from_millis(5));
    let later = g.timestamp(0).result;
    assert!(later >= last + 5_000_000, "5 ms passed: {last} -> {later}");
}

/// Launches and timestamps submitted together run as one queued run:
/// in order (the copy sees the fill), a refused launch fails alone, and
/// the timestamps around the work are at least its device time apart.
#[test]
fn test_launches_and_timestamps_of_one_submission_complete_in_order() {
    let (_s, mut g) = vgpu_ready();
    let a = g.device_alloc(0, 64 << 10);
    let b = g.device_alloc(0, 64 << 10);
    let words = 16 << 10;
    let fill = abi::FillParams {
        dst: a,
        count: words,
        value: 0x5a5a_0001,
        reserved: 0,
    };
    let copy = |dst, src, bytes| abi::CopyParams { dst, src, bytes };
    let launch = |entry: &str, params: &[u8]| {
        let cmd = launch_cmd(entry, [1, 1, 1], [256, 1, 1], params.len() as u32);
        Chain::command(&cmd).bytes(params).completion()
    };
    let stamp = || bare_chain(abi::OP_TIMESTAMP);
    let chains = [
        stamp(),
        launch("fill_u32", fill.as_slice()),
        launch("copy", copy(b, a, words * 4).as_slice()),
        launch("copy", copy(a + 4, a, 64).as_slice()),
        stamp(),
        launch("no_such_kernel", fill.as_slice()),
        stamp(),
    ];
    let done: Vec<_> = g
        .submit_batch(0, &chains)
        .iter()
        .map(|u| u.completion())
        .collect();
    let statuses: Vec<u32> = done.iter().map(|c| c.status).collect();
    assert_eq!(
        statuses,
        [
            abi::STATUS_OK,
            abi::STATUS_OK,
            abi::STATUS_OK,
            abi::STATUS_INVALID,
            abi::STATUS_OK,
            abi::STATUS_NOT_FOUND,
            abi::STATUS_OK,
        ]
    );
    let (t0, t1, t2) = (done[0].result, done[4].result, done[6].result);
    assert!(t0 <= t1 && t1 <= t2, "timestamps went back: {t0} {t1} {t2}");
    let work: u64 = done[1..4].iter().map(|c| c.device_ns).sum();
    assert!(
        t1 - t0 >= work,
        "{} ns between the stamps, {work} ns of work between them",
        t1 - t0
    );
    let want = 0x5a5a_0001u32.to_le_bytes().repeat(words as usize);
    assert_eq!(g.download(0, b, want.len()), want);
}

/// Copies between guest and device memory submitted together, one way,
/// run as one queued run: each moves its own bytes, one with a bad device
/// range fails alone; a run whose guest memory is not all mapped runs
/// copy by copy, the unmapped one failing with FAULT.
#[test]
fn test_copies_of_one_submission_run_together() {
    let (_s, mut g) = vgpu_ready();
    let a = g.device_alloc(0, 64 << 10);
    let b = g.device_alloc(0, 64 << 10);
    let mut rng = Rng(7);
    let sg1 = g.alloc_sg(&[4096, 8192, 100]);
    let sg2 = g.alloc_sg(&[3000]);
    let (d1, d2) = (rng.bytes(12388), rng.bytes(3000));
    g.write_sg(&sg1, &d1);
    g.write_sg(&sg2, &d2);
    let out_of_range = b + (1 << 30);
    let ups = [
        guest_copy_chain(true, a, &sg1),
        guest_copy_chain(true, b, &sg2),
        guest_copy_chain(true, out_of_range, &sg2),
        guest_copy_chain(true, b + 8192, &sg1),
    ];
    let statuses = g.batch_statuses(0, &ups);
    assert_eq!(
        statuses,
        [
            abi::STATUS_OK,
            abi::STATUS_OK,
            abi::STATUS_OUT_OF_RANGE,
            abi::STATUS_OK
        ]
    );
    let back1 = g.alloc_sg(&[12388]);
    let back2 = g.alloc_sg(&[1000, 2000]);
    let back3 = g.alloc_sg(&[12388]);
    let downs = [
        guest_copy_chain(false, a, &back1),
        guest_copy_chain(false, b, &back2),
        guest_copy_chain(false, b + 8192, &back3),
    ];
    for u in g.submit_batch(0, &downs) {
        assert_status(u.completion(), abi::STATUS_OK);
    }
    assert_eq!(g.read_sg(&back1), d1);
    assert_eq!(g.read_sg(&back2), d2);
    assert_eq!(g.read_sg(&back3), d1);

    let unmapped = [SgEntry {
        addr: g.unmapped_addr(),
        len: 4096,
    }];
    let fresh = g.alloc_sg(&[3000]);
    let mixed = [
        guest_copy_chain(false, b, &fresh),
        guest_copy_chain(false, a, &unmapped),
    ];
    let statuses = g.batch_statuses(0, &mixed);
    assert_eq!(statuses, [abi::STATUS_OK, abi::STATUS_FAULT]);
    assert_eq!(g.read_sg(&fresh), d2);
}

/// Fills, device copies and no-ops run in the same queued run as the
/// timestamps and uploads around them, in order: each sees the one
/// before; a refused fill fails alone; a download after the uploads
/// starts a run of its own and sees them all.
#[test]
fn test_fills_and_device_copies_run_with_the_steps_around_them() {
    let (_s, mut g) = vgpu_ready();
    let a = g.device_alloc(0, 16 << 10);
    let b = g.device_alloc(0, 16 << 10);
    let mut rng = Rng(3);
    let sg = g.alloc_sg(&[4096, 4096]);
    let data = rng.bytes(8192);
    g.write_sg(&sg, &data);
    let fill = fill_chain;
    let device_copy = |dst, src, size| {
        let cmd = copy_cmd(abi::COPY_DEVICE, abi::COPY_DEVICE, src, dst, size, 0);
        Chain::command(&cmd).completion()
    };
    let stamp = || bare_chain(abi::OP_TIMESTAMP);
    let nop = || bare_chain(abi::OP_NOP);
    let back = g.alloc_sg(&[16 << 10]);
    let chains = [
        stamp(),
        nop(),
        fill(a, 16 << 10, 0x1111_1111),
        guest_copy_chain(true, a + 4096, &sg),
        device_copy(b, a, 16 << 10),
        fill(b, 6, 0),
        fill(b + 12288, 4096, 0x2222_2222),
        device_copy(b + 1, b, 4096),
        stamp(),
        guest_copy_chain(false, b, &back),
    ];
    let done: Vec<_> = g
        .submit_batch(0, &chains)
        .iter()
        .map(|u| u.completion())
        .collect();
    let statuses: Vec<u32> = done.iter().map(|c| c.status).collect();
    let ok = abi::STATUS_OK;
    assert_eq!(
        statuses,
        [ok, ok, ok, ok, ok, abi::STATUS_INVALID, ok, ok, ok, ok]
    );
    assert!(done[0].result <= done[8].result, "timestamps went back");
    let mut want = vec![0x11u8; 16 << 10];
    want[4096..12288].copy_from_slice(&data);
    want[12288..].fill(0x22);
    // The overlapping copy moved the first 4 KiB up by a byte.
    let moved = want[..4096].to_vec();
    want[1..4097].copy_from_slice(&moved);
    assert_eq!(g.read_sg(&back), want);
}

#[test]
fn test_mem_alloc_and_free() {
    let (_s, mut g) = vgpu_ready();
    assert_eq!(g.mem_used(), 0);
    let a = g.mem_alloc(0, 1000, 0);
    assert_status(a, abi::STATUS_OK);
    assert_ne!(a.result, 0);
    assert_eq!(a.result % 256, 0, "default alignment is 256");
    assert_eq!(g.mem_used(), 1000);
    let b = g.mem_alloc(0, 4096, 1 << 16);
    assert_status(b, abi::STATUS_OK);
    assert_eq!(b.result % (1 << 16), 0);
    assert_eq!(g.mem_used(), 5096);
    // New memory reads as zeros.
    assert_eq!(g.download(0, a.result, 1000), vec![0; 1000]);

    assert_status(g.mem_free(0, a.result), abi::STATUS_OK);
    assert_eq!(g.mem_used(), 4096);
    assert_status(g.mem_free(0, b.result), abi::STATUS_OK);
    assert_eq!(g.mem_used(), 0);
}

#[test]
fn test_mem_alloc_rejects_bad_arguments() {
    let (_s, mut g) = vgpu_ready();
    assert_status(g.mem_alloc(0, 0, 0), abi::STATUS_INVALID);
    for align in [3, 24, 1000, u64::MAX] {
        assert_status(g.mem_alloc(0, 64, align), abi::STATUS_INVALID);
    }
    // A power of two beyond what the partition can align to.
    assert_status(g.mem_alloc(0, 64, 1 << 40), abi::STATUS_INVALID);
    assert_eq!(g.mem_used(), 0);
}

#[test]
fn test_mem_free_of_unknown_or_freed_address_is_not_found() {
    let (_s, mut g) = vgpu_ready();
    let a = g.device_alloc(0, 4096);
    assert_status(g.mem_free(0, a + 256), abi::STATUS_NOT_FOUND);
    assert_status(g.mem_free(0, 0), abi::STATUS_NOT_FOUND);
    assert_eq!(g.mem_used(), 4096);
    assert_status(g.mem_free(0, a), abi::STATUS_OK);
    assert_status(g.mem_free(0, a), abi::STATUS_NOT_FOUND);
    assert_eq!(g.mem_used(), 0);
}

#[test]
fn test_quota_exhaustion_is_no_memory_and_changes_nothing() {
    let (_s, mut g) = vgpu_with_memory(1, MIB);
    g.setup_queue(0, 32, Mode::Interrupt);
    let a = g.device_alloc(0, 768 << 10);
    let data = Rng(7).bytes(4096);
    g.upload(0, a, &data);
    let commands = g.commands();

    assert_status(g.mem_alloc(0, 512 << 10, 0), abi::STATUS_NO_MEMORY);
    assert_status(g.mem_alloc(0, u64::MAX, 0), abi::STATUS_NO_MEMORY);
    assert_status(g.mem_alloc(0, 2 * MIB, 0), abi::STATUS_NO_MEMORY);
    assert_eq!(g.mem_used(), 768 << 10, "failed allocations took nothing");
    assert_eq!(g.commands(), commands + 3);
    assert_eq!(g.download(0, a, 4096), data, "existing memory intact");

    // What is left can still be had, exactly.
    let b = g.device_alloc(0, 256 << 10);
    assert_eq!(g.mem_used(), MIB);
    assert_status(g.mem_alloc(0, 1, 0), abi::STATUS_NO_MEMORY);
    assert_status(g.mem_free(0, b), abi::STATUS_OK);
    assert_status(g.mem_free(0, a), abi::STATUS_OK);
    let all = g.mem_alloc(0, MIB, 0);
    assert_status(all, abi::STATUS_OK);
    assert_eq!(g.mem_used(), MIB);
}

#[test]
fn test_copy_guest_to_device_and_back() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64 << 10);
    let data = Rng(1).bytes(64 << 10);
    let src = g.alloc_bytes(&data);
    let c = g.copy_to_device(
        0,
        dev,
        &[SgEntry {
            addr: src,
            len: data.len() as u64,
        }],
    );
    assert_status(c, abi::STATUS_OK);
    let dst = g.alloc(data.len() as u64, 64);
    let c = g.copy_from_device(
        0,
        dev,
        &[SgEntry {
            addr: dst,
            len: data.len() as u64,
        }],
    );
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.read(dst, data.len()), data);
}

#[test]
fn test_copy_with_scatter_gather_lists() {
    let (_s, mut g) = vgpu_ready();
    let total = 3 + 4096 + 17 + 12_000 + 1 + 777;
    let dev = g.device_alloc(0, total + 100);
    let data = Rng(2).bytes(total as usize);

    // Scattered in six odd pieces on the way in...
    let sg_in = g.alloc_sg(&[3, 4096, 17, 12_000, 1, 777]);
    g.write_sg(&sg_in, &data);
    assert_status(g.copy_to_device(0, dev + 100, &sg_in), abi::STATUS_OK);
    // ...and gathered back in three other pieces, at an offset.
    let sg_out = g.alloc_sg(&[10_000, 6000, total - 16_000]);
    assert_status(g.copy_from_device(0, dev + 100, &sg_out), abi::STATUS_OK);
    assert_eq!(g.read_sg(&sg_out), data);
    // The 100 bytes before stay zero.
    assert_eq!(g.download(0, dev, 100), vec![0; 100]);

    // The largest list the ABI allows.
    let lens = vec![8u64; abi::MAX_SG_ENTRIES as usize];
    let sg = g.alloc_sg(&lens);
    assert_status(g.copy_from_device(0, dev + 100, &sg), abi::STATUS_OK);
    assert_eq!(g.read_sg(&sg), data[..8 * abi::MAX_SG_ENTRIES as usize]);
}

#[test]
fn test_copy_sg_list_spread_over_descriptor_and_extra_bytes() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    let data = Rng(3).bytes(96);
    let sg = g.alloc_sg(&[32, 64]);
    g.write_sg(&sg, &data);
    // The SG descriptor may be longer than sg_count entries.
    let mut raw: Vec<u8> = sg.iter().flat_map(|e| e.as_slice().to_vec()).collect();
    raw.extend_from_slice(&[0xff; 32]);
    let cmd = copy_cmd(abi::COPY_GUEST, abi::COPY_DEVICE, 0, dev, 96, 2);
    let c = g.run(0, &Chain::command(&cmd).bytes(&raw).completion());
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.download(0, dev, 96), data);
}

#[test]
fn test_copy_window_and_device() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64 << 10);
    let data = Rng(4).bytes(40_000);
    g.window_write(0x1000, &data);
    assert_status(
        g.copy_window_to_device(0, 0x1000, dev, 40_000),
        abi::STATUS_OK,
    );
    assert_eq!(g.download(0, dev, 40_000), data);
    assert_status(
        g.copy_device_to_window(0, dev + 5, 0x20000, 30_000),
        abi::STATUS_OK,
    );
    assert_eq!(g.window_read(0x20000, 30_000), data[5..30_005]);
    // The very end of the window is usable.
    let size = 1 << 20;
    assert_status(
        g.copy_device_to_window(0, dev, size - 16, 16),
        abi::STATUS_OK,
    );
    assert_eq!(g.window_read(size - 16, 16), data[..16]);
}

#[test]
fn test_copy_device_to_device() {
    let (_s, mut g) = vgpu_ready();
    let a = g.device_alloc(0, 8192);
    let b = g.device_alloc(0, 8192);
    let data = Rng(5).bytes(8192);
    g.upload(0, a, &data);
    assert_status(g.copy_device_to_device(0, b + 100, a, 4000), abi::STATUS_OK);
    let got = g.download(0, b, 8192);
    assert_eq!(got[100..4100], data[..4000]);
    assert_eq!(got[..100], [0; 100]);
    assert_eq!(got[4100..], vec![0; 8192 - 4100]);
    // Overlapping, inside one allocation: memmove semantics.
    assert_status(g.copy_device_to_device(0, a + 10, a, 1000), abi::STATUS_OK);
    let got = g.download(0, a, 2000);
    assert_eq!(got[10..1010], data[..1000]);
}

#[test]
fn test_copy_unsupported_kind_pairs_are_invalid() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    let sg = g.alloc_sg(&[64]);
    let pairs = [
        (abi::COPY_GUEST, abi::COPY_GUEST),
        (abi::COPY_WINDOW, abi::COPY_WINDOW),
        (abi::COPY_GUEST, abi::COPY_WINDOW),
        (abi::COPY_WINDOW, abi::COPY_GUEST),
        (3, abi::COPY_DEVICE),
        (abi::COPY_DEVICE, 3),
        (u32::MAX, u32::MAX),
    ];
    for (s, d) in pairs {
        let cmd = copy_cmd(s, d, dev, dev, 64, 1);
        let c = g.copy(0, &cmd, Some(&sg));
        assert_status(c, abi::STATUS_INVALID);
    }
}

#[test]
fn test_copy_malformed_sizes_and_lists_are_invalid() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    let sg = g.alloc_sg(&[100, 200]);
    let up = |size, count| copy_cmd(abi::COPY_GUEST, abi::COPY_DEVICE, 0, dev, size, count);
    // Size differs from the SG total, either way.
    assert_status(g.copy(0, &up(299, 2), Some(&sg)), abi::STATUS_INVALID);
    assert_status(g.copy(0, &up(301, 2), Some(&sg)), abi::STATUS_INVALID);
    assert_status(g.copy(0, &up(100, 1), Some(&sg[..1])), abi::STATUS_OK);
    // Size 0.
    assert_status(g.copy(0, &up(0, 1), Some(&sg)), abi::STATUS_INVALID);
    // No entries, or more than the ABI allows.
    assert_status(g.copy(0, &up(300, 0), Some(&sg)), abi::STATUS_INVALID);
    let many = vec![
        SgEntry {
            addr: sg[0].addr,
            len: 1
        };
        abi::MAX_SG_ENTRIES as usize + 1
    ];
    let n = many.len() as u64;
    assert_status(
        g.copy(0, &up(n, n as u32), Some(&many)),
        abi::STATUS_INVALID,
    );
    // sg_count larger than the descriptor holds.
    assert_status(g.copy(0, &up(300, 3), Some(&sg)), abi::STATUS_INVALID);
    // No SG descriptor at all.
    assert_status(g.copy(0, &up(300, 2), None), abi::STATUS_INVALID);
    // An empty entry.
    let with_empty = [
        sg[0],
        SgEntry {
            addr: sg[1].addr,
            len: 0,
        },
        sg[1],
    ];
    assert_status(
        g.copy(0, &up(300, 3), Some(&with_empty)),
        abi::STATUS_INVALID,
    );
    // An entry whose end overflows.
    let wrap = [SgEntry {
        addr: u64::MAX - 10,
        len: 100,
    }];
    assert_status(g.copy(0, &up(100, 1), Some(&wrap)), abi::STATUS_INVALID);
    // Reserved must be zero.
    let mut cmd = up(300, 2);
    cmd.reserved = 1;
    assert_status(g.copy(0, &cmd, Some(&sg)), abi::STATUS_INVALID);
    // Downloads check the same.
    let down = copy_cmd(abi::COPY_DEVICE, abi::COPY_GUEST, dev, 0, 299, 2);
    assert_status(g.copy(0, &down, Some(&sg)), abi::STATUS_INVALID);
    // Totals that overflow u64.
    let huge = [
        SgEntry {
            addr: sg[0].addr,
            len: u64::MAX / 2 + 1,
        },
        SgEntry {
            addr: sg[1].addr,
            len: u64::MAX / 2 + 1,
        },
    ];
    assert_status(
        g.copy(0, &up(u64::MAX, 2), Some(&huge)),
        abi::STATUS_INVALID,
    );
}

#[test]
fn test_copy_outside_device_allocations_is_out_of_range() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    let other = g.device_alloc(0, 4096);
    let sg = g.alloc_sg(&[64]);
    // Running off the end by one byte.
    assert_status(
        g.copy_to_device(0, dev + 4096 - 63, &sg),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_status(
        g.copy_from_device(0, dev + 4096 - 63, &sg),
        abi::STATUS_OUT_OF_RANGE,
    );
    // Addresses never allocated.
    for addr in [0, dev - 64, dev + 4096, u64::MAX - 63] {
        assert_status(g.copy_to_device(0, addr, &sg), abi::STATUS_OUT_OF_RANGE);
        assert_status(g.copy_from_device(0, addr, &sg), abi::STATUS_OUT_OF_RANGE);
    }
    // Device to device across the end of either side.
    assert_status(
        g.copy_device_to_device(0, other, dev, 4097),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_status(
        g.copy_device_to_device(0, other + 1, dev, 4096),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_status(
        g.copy_window_to_device(0, 0, dev + 1, 4096),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_status(
        g.copy_device_to_window(0, dev + 1, 0, 4096),
        abi::STATUS_OUT_OF_RANGE,
    );
    // Freed memory is gone.
    assert_status(g.mem_free(0, dev), abi::STATUS_OK);
    assert_status(g.copy_to_device(0, dev, &sg), abi::STATUS_OUT_OF_RANGE);
    assert_eq!(g.mem_used(), 4096);
}

#[test]
fn test_copy_window_offsets_past_the_end_are_invalid() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 8192);
    let size = 1u64 << 20;
    for (off, len) in [
        (size, 1),
        (size - 4, 8),
        (size + 4096, 16),
        (u64::MAX - 4, 8),
        (size - 8191, 8192),
    ] {
        assert_status(
            g.copy_window_to_device(0, off, dev, len),
            abi::STATUS_INVALID,
        );
        assert_status(
            g.copy_device_to_window(0, dev, off, len),
            abi::STATUS_INVALID,
        );
    }
}

#[test]
fn test_copy_with_sg_in_unmapped_guest_memory_faults() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    let bad = g.unmapped_addr();
    let sg = [SgEntry { addr: bad, len: 64 }];
    assert_status(g.copy_to_device(0, dev, &sg), abi::STATUS_FAULT);
    assert_status(g.copy_from_device(0, dev, &sg), abi::STATUS_FAULT);
    // A list whose second entry runs past the end of guest RAM.
    let good = g.alloc_sg(&[32])[0];
    let end = g.ram().iova() + g.ram().size();
    let sg = [
        good,
        SgEntry {
            addr: end - 16,
            len: 32,
        },
    ];
    assert_status(g.copy_from_device(0, dev, &sg), abi::STATUS_FAULT);
    // The list itself in unmapped memory.
    let cmd = copy_cmd(abi::COPY_GUEST, abi::COPY_DEVICE, 0, dev, 64, 1);
    let c = g.run(0, &Chain::command(&cmd).read(bad, 16).completion());
    assert_status(c, abi::STATUS_FAULT);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_fill() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    assert_status(g.fill(0, dev + 64, 1024, 0xdead_beef), abi::STATUS_OK);
    let got = g.download(0, dev, 4096);
    assert_eq!(got[..64], [0; 64]);
    for w in got[64..1088].chunks_exact(4) {
        assert_eq!(w, 0xdead_beefu32.to_le_bytes());
    }
    assert_eq!(got[1088..], vec![0; 4096 - 1088]);
    // Whole allocation, byte-repeating pattern.
    assert_status(g.fill(0, dev, 4096, 0x5a5a_5a5a), abi::STATUS_OK);
    assert_eq!(g.download(0, dev, 4096), vec![0x5a; 4096]);
}

#[test]
fn test_fill_failures() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 4096);
    assert_status(g.fill(0, dev, 0, 1), abi::STATUS_INVALID);
    assert_status(g.fill(0, dev, 6, 1), abi::STATUS_INVALID);
    assert_status(g.fill(0, dev, 4100, 1), abi::STATUS_OUT_OF_RANGE);
    assert_status(g.fill(0, dev + 4, 4096, 1), abi::STATUS_OUT_OF_RANGE);
    assert_status(g.fill(0, 0x1000, 4, 1), abi::STATUS_OUT_OF_RANGE);
    let cmd = abi::FillCmd {
        hdr: CmdHeader {
            opcode: abi::OP_FILL,
            flags: 0,
        },
        addr: dev,
        size: 16,
        pattern: 1,
        reserved: 1,
    };
    assert_status(g.run_cmd(0, &cmd), abi::STATUS_INVALID);
    assert_eq!(
        g.download(0, dev, 4096),
        vec![0; 4096],
        "nothing was filled"
    );
}

/// The guest ABI's MODULE_LOAD and LAUNCH run nvcc's PTX on the software
/// backend: a module image over several descriptors, a grid of blocks,
/// the result in device memory.
#[test]
fn test_loaded_ptx_runs_through_the_queue_on_software() {
    let (_s, mut g) = vgpu_ready();
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    // Split over two descriptors, as a large image is.
    let cmd = abi::ModuleLoadCmd {
        hdr: CmdHeader {
            opcode: abi::OP_MODULE_LOAD,
            flags: 0,
        },
        format: abi::MODULE_FORMAT_PTX,
        reserved: 0,
        image_size: ptx.len() as u64,
    };
    let half = ptx.len() / 2;
    let c = g.run(
        0,
        &Chain::command(&cmd)
            .bytes(&ptx[..half])
            .bytes(&ptx[half..])
            .completion(),
    );
    assert_status(c, abi::STATUS_OK);
    let module = c.result;
    assert_ne!(module, abi::MODULE_BUILTIN);
    let n = 10_000u32;
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (2 * i) as f32 + 0.5).collect();
    let bytes = u64::from(n) * 4;
    let (da, db, dc) = (
        g.device_alloc(0, bytes),
        g.device_alloc(0, bytes),
        g.device_alloc(0, bytes),
    );
    g.upload(0, da, &f32s_to_bytes(&a));
    g.upload(0, db, &f32s_to_bytes(&b));
    let params = conformance::Params::default()
        .u64(da)
        .u64(db)
        .u64(dc)
        .u32(n);
    let mut launch = launch_cmd("vector_add", [n.div_ceil(128), 1, 1], [128, 1, 1], 28);
    launch.module = module;
    assert_status(g.launch_raw(0, &launch, &params.0), abi::STATUS_OK);
    let c_out = bytes_to_f32s(&g.download(0, dc, bytes as usize));
    assert!(c_out.iter().enumerate().all(|(i, &x)| x == a[i] + b[i]));
    // A store far outside the vGPU's memory fails the launch with a
    // kernel fault (CUDA_ERROR_ILLEGAL_ADDRESS); the vGPU goes on.
    let poke = g.module_load(0, abi::MODULE_FORMAT_PTX, conformance::POKE_PTX.as_bytes());
    assert_status(poke, abi::STATUS_OK);
    let mut launch = launch_cmd("poke", [1, 1, 1], [1, 1, 1], 8);
    launch.module = poke.result;
    let wild = conformance::Params::default().u64(dc + (1 << 40));
    assert_status(g.launch_raw(0, &launch, &wild.0), abi::STATUS_KERNEL_FAULT);
    assert_status(g.module_unload(0, module), abi::STATUS_OK);
    assert_status(g.module_unload(0, module), abi::STATUS_NOT_FOUND);
    // An unknown format is unsupported; an image that is no PTX is invalid.
    let image = b".version 8.0\n.target sm_80\n.address_size 64\n".to_vec();
    assert_status(g.module_load(0, 77, &image), abi::STATUS_UNSUPPORTED);
    assert_status(
        g.module_load(0, abi::MODULE_FORMAT_PTX, &vec![b'x'; 300_000]),
        abi::STATUS_INVALID,
    );
}

/// OCCUPANCY counts the clusters of a function's launch shape that fit at
/// once (the software backend: one block per compute unit, no clusters);
/// every field is checked first.
#[test]
fn test_occupancy_counts_clusters_of_a_described_function() {
    let (_s, mut g) = vgpu_ready();
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    let module = g.module_load(0, abi::MODULE_FORMAT_PTX, &ptx).result;
    let out = g.device_alloc(0, 4096);
    let handle = g.func_info(0, module, "vector_add", out, 4096).result;
    let cmd = abi::OccupancyCmd {
        hdr: CmdHeader {
            opcode: abi::OP_OCCUPANCY,
            flags: 0,
        },
        module,
        function: handle,
        block: [128, 1, 1],
        shared_mem: 0,
        cluster: [1, 1, 1],
        reserved: 0,
    };
    let mut ask = |c: abi::OccupancyCmd| g.run(0, &Chain::command(&c).completion());
    let c = ask(cmd);
    assert_status(c, abi::STATUS_OK);
    assert_eq!(c.result, 2, "one block on each of the two compute units");
    // Clusters: none fits here, up to sizes no launch may use (libraries
    // probe them).
    for cluster in [[2, 1, 1], [18, 1, 1], [8, 8, 1]] {
        let c = ask(abi::OccupancyCmd { cluster, ..cmd });
        assert_eq!((c.status, c.result), (abi::STATUS_OK, 0), "{cluster:?}");
    }
    for (bad, status) in [
        (
            abi::OccupancyCmd {
                function: handle + 7,
                ..cmd
            },
            abi::STATUS_NOT_FOUND,
        ),
        (
            abi::OccupancyCmd {
                module: module + 1,
                ..cmd
            },
            abi::STATUS_NOT_FOUND,
        ),
        (
            abi::OccupancyCmd { reserved: 1, ..cmd },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                hdr: CmdHeader {
                    opcode: abi::OP_OCCUPANCY,
                    flags: 1,
                },
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                cluster: [0, 1, 1],
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                cluster: [65, 1, 1],
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                cluster: [8, 8, 2],
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                block: [0, 1, 1],
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                block: [2048, 1, 1],
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
        (
            abi::OccupancyCmd {
                shared_mem: u32::MAX,
                ..cmd
            },
            abi::STATUS_INVALID,
        ),
    ] {
        assert_status(ask(bad), status);
    }
    // The handle ends with its module.
    assert_status(g.module_unload(0, module), abi::STATUS_OK);
    assert_status(
        g.run(0, &Chain::command(&cmd).completion()),
        abi::STATUS_NOT_FOUND,
    );
}

/// FUNC_INFO describes a loaded kernel into device memory, and its handle
/// launches the kernel; handles belong to their module and end with it.
#[test]
fn test_func_info_describes_and_launches_by_handle() {
    let (_s, mut g) = vgpu_ready();
    let ptx = conformance::portable(conformance::corpus::VECTOR_ADD);
    let module = g.module_load(0, abi::MODULE_FORMAT_PTX, &ptx);
    assert_status(module, abi::STATUS_OK);
    let module = module.result;
    let out = g.device_alloc(0, 4096);
    let c = g.func_info(0, module, "vector_add", out, 4096);
    assert_status(c, abi::STATUS_OK);
    let handle = c.result;
    assert_ne!(handle, 0);
    let raw = g.download(0, out, 64 + 4 * 8);
    let info = abi::FuncInfo::from_slice(&raw[..64]).copied().unwrap();
    assert_eq!((info.param_count, info.params_size), (4, 28));
    let params: Vec<(u32, u32)> = raw[64..]
        .chunks(8)
        .map(|p| abi::FuncParam::from_slice(p).copied().unwrap())
        .map(|p| (p.offset, p.size))
        .collect();
    assert_eq!(params, [(0, 8), (8, 8), (16, 8), (24, 4)]);
    // The same name gives the same handle; a room for the header alone
    // still says how many parameters there are.
    let again = g.func_info(0, module, "vector_add", out + 1024, 64);
    assert_eq!((again.status, again.result), (abi::STATUS_OK, handle));
    let short = g.download(0, out + 1024, 64);
    assert_eq!(abi::FuncInfo::from_slice(&short).unwrap().param_count, 4);

    let n = 1000u32;
    let bytes = u64::from(n) * 4;
    let (da, db, dc) = (
        g.device_alloc(0, bytes),
        g.device_alloc(0, bytes),
        g.device_alloc(0, bytes),
    );
    let a: Vec<f32> = (0..n).map(|i| i as f32).collect();
    g.upload(0, da, &f32s_to_bytes(&a));
    g.upload(0, db, &f32s_to_bytes(&a));
    let p = conformance::Params::default()
        .u64(da)
        .u64(db)
        .u64(dc)
        .u32(n);
    let mut launch = launch_cmd("", [n.div_ceil(128), 1, 1], [128, 1, 1], 28);
    launch.module = module;
    launch.hdr.flags = abi::LAUNCH_FLAG_FUNCTION;
    launch.entry = abi::entry_function(handle, [0; 3]);
    assert_status(g.launch_raw(0, &launch, &p.0), abi::STATUS_OK);
    let c_out = bytes_to_f32s(&g.download(0, dc, bytes as usize));
    assert!(c_out.iter().enumerate().all(|(i, &x)| x == 2.0 * a[i]));

    // A handle of another module, an unknown handle, a bad flag.
    let mut other = launch;
    other.module = abi::MODULE_BUILTIN;
    assert_status(g.launch_raw(0, &other, &p.0), abi::STATUS_NOT_FOUND);
    let mut unknown = launch;
    unknown.entry = abi::entry_function(handle + 100, [0; 3]);
    assert_status(g.launch_raw(0, &unknown, &p.0), abi::STATUS_NOT_FOUND);
    let mut flag = launch;
    flag.hdr.flags = abi::LAUNCH_FLAG_FUNCTION | 1 << 2;
    assert_status(g.launch_raw(0, &flag, &p.0), abi::STATUS_INVALID);
    // Clusters: the grid must divide into them, 16 blocks at most; the
    // software backend runs blocks alone.
    let mut clustered = launch;
    clustered.entry = abi::entry_function(handle, [3, 1, 1]);
    assert_status(g.launch_raw(0, &clustered, &p.0), abi::STATUS_INVALID);
    clustered.grid = [32, 1, 1];
    clustered.entry = abi::entry_function(handle, [32, 1, 1]);
    assert_status(g.launch_raw(0, &clustered, &p.0), abi::STATUS_INVALID);
    clustered.entry = abi::entry_function(handle, [2, 1, 1]);
    assert_status(g.launch_raw(0, &clustered, &p.0), abi::STATUS_UNSUPPORTED);

    // Malformed lookups.
    assert_status(
        g.func_info(0, module, "no_such_kernel", out, 4096),
        abi::STATUS_NOT_FOUND,
    );
    assert_status(
        g.func_info(0, module, "vector_add", out, 63),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.func_info(0, module, "vector_add", out + 4050, 4096),
        abi::STATUS_OUT_OF_RANGE,
    );
    assert_status(g.func_info(0, module, "", out, 4096), abi::STATUS_INVALID);
    let long = "x".repeat(abi::MAX_ENTRY_NAME as usize + 1);
    assert_status(
        g.func_info(0, module, &long, out, 4096),
        abi::STATUS_INVALID,
    );
    assert_status(
        g.func_info(0, module, "vec\0add", out, 4096),
        abi::STATUS_INVALID,
    );
    let cmd = abi::FuncInfoCmd {
        hdr: CmdHeader {
            opcode: abi::OP_FUNC_INFO,
            flags: 0,
        },
        module,
        out,
        out_size: 4096,
        name_len: 100,
    };
    let c = g.run(0, &Chain::command(&cmd).bytes(b"vector_add").completion());
    assert_status(c, abi::STATUS_INVALID);

    // Unloading the module ends its handles.
    assert_status(g.module_unload(0, module), abi::STATUS_OK);
    assert_status(g.launch_raw(0, &launch, &p.0), abi::STATUS_NOT_FOUND);
}

#[test]
fn test_module_load_malformed_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let cmd = |image_size| abi::ModuleLoadCmd {
        hdr: CmdHeader {
            opcode: abi::OP_MODULE_LOAD,
            flags: 0,
        },
        format: abi::MODULE_FORMAT_PTX,
        reserved: 0,
        image_size,
    };
    // Empty, larger than the descriptors, larger than the ABI allows.
    let c = g.run(0, &Chain::command(&cmd(0)).bytes(b"x").completion());
    assert_status(c, abi::STATUS_INVALID);
    let c = g.run(0, &Chain::command(&cmd(100)).bytes(&[1; 99]).completion());
    assert_status(c, abi::STATUS_INVALID);
    let c = g.run(
        0,
        &Chain::command(&cmd(abi::MAX_MODULE_SIZE + 1))
            .bytes(&[1; 64])
            .completion(),
    );
    assert_status(c, abi::STATUS_INVALID);
    // No image descriptor.
    let c = g.run(0, &Chain::command(&cmd(16)).completion());
    assert_status(c, abi::STATUS_INVALID);
}

#[test]
fn test_module_unload() {
    let (_s, mut g) = vgpu_ready();
    assert_status(g.module_unload(0, abi::MODULE_BUILTIN), abi::STATUS_INVALID);
    assert_status(g.module_unload(0, 42), abi::STATUS_NOT_FOUND);
}

#[test]
fn test_command_descriptor_too_short_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let fence = abi::FenceCmd {
        hdr: CmdHeader {
            opcode: abi::OP_FENCE,
            flags: 0,
        },
        addr: g.alloc(8, 8),
        value: 1,
    };
    let c = g.run(0, &Chain::new().bytes(&fence.as_slice()[..20]).completion());
    assert_status(c, abi::STATUS_INVALID);
    let c = g.run(0, &Chain::new().bytes(&[0; 7]).completion());
    assert_status(c, abi::STATUS_INVALID);
    let alloc = abi::MemAllocCmd {
        hdr: CmdHeader {
            opcode: abi::OP_MEM_ALLOC,
            flags: 0,
        },
        size: 4096,
        align: 0,
    };
    let c = g.run(0, &Chain::new().bytes(&alloc.as_slice()[..16]).completion());
    assert_status(c, abi::STATUS_INVALID);
    assert_eq!(g.mem_used(), 0);
}

#[test]
fn test_chain_of_only_a_completion_buffer_is_invalid() {
    let (_s, mut g) = vgpu_ready();
    let c = g.run(0, &Chain::new().completion());
    assert_status(c, abi::STATUS_INVALID);
}

#[test]
fn test_command_in_unmapped_memory_faults() {
    let (_s, mut g) = vgpu_ready();
    let bad = g.unmapped_addr();
    let c = g.run(0, &Chain::new().read(bad, 16).completion());
    assert_status(c, abi::STATUS_FAULT);
    assert_status(g.nop(0), abi::STATUS_OK);
}

#[test]
fn test_missing_or_unusable_completion_buffer_is_skipped() {
    let (_s, mut g) = vgpu_ready();
    let nop = g.alloc_bytes(CmdHeader::default().as_slice());
    // No writable descriptor: used with length 0.
    let used = g.submit_raw(0, &[(nop, 8, false)]).expect("returned");
    assert_eq!(used.len, 0);
    // Too small for a completion: untouched, length 0.
    let small = g.alloc(16, 8);
    g.write(small, &[0xee; 16]);
    let used = g
        .submit_raw(0, &[(nop, 8, false), (small, 16, true)])
        .expect("returned");
    assert_eq!(used.len, 0);
    assert_eq!(g.read(small, 16), vec![0xee; 16]);
    // In unmapped memory: length 0.
    let bad = g.unmapped_addr();
    let used = g
        .submit_raw(0, &[(nop, 8, false), (bad, 32, true)])
        .expect("returned");
    assert_eq!(used.len, 0);
    // A larger one gets the 32 bytes of the completion.
    let big = g.alloc(64, 8);
    g.write(big, &[0xee; 64]);
    let used = g
        .submit_raw(0, &[(nop, 8, false), (big, 64, true)])
        .expect("returned");
    assert_eq!(used.len, 32);
    let c: abi::Completion = g.read_obj(big);
    assert_status(c, abi::STATUS_OK);
    assert_eq!((c.reserved, c.result, c.result2), (0, 0, 0));
    assert_eq!(g.read(big + 32, 32), vec![0xee; 32]);
    // The queue is still healthy.
    assert_status(g.nop(0), abi::STATUS_OK);
    assert_eq!(g.queue_status(0), abi::QSTATUS_ENABLED);
}

#[test]
fn test_completion_goes_to_the_last_writable_descriptor() {
    let (_s, mut g) = vgpu_ready();
    let dev = g.device_alloc(0, 64);
    let sg = g.alloc_sg(&[64]);
    let first = g.alloc(32, 8);
    g.write(first, &[0xcc; 32]);
    let cmd = copy_cmd(abi::COPY_DEVICE, abi::COPY_GUEST, dev, 0, 64, 1);
    let sg_bytes: Vec<u8> = sg.iter().flat_map(|e| e.as_slice().to_vec()).collect();
    let c = g.run(
        0,
        &Chain::command(&cmd)
            .bytes(&sg_bytes)
            .write(first, 32)
            .completion(),
    );
    assert_status(c, abi::STATUS_OK);
    assert_eq!(g.read(first, 32), vec![0xcc; 32]);
}

/// CONSOLE writes what a module's kernels printed into guest memory (a
/// scatter-gather list, as COPY's guest side), oldest first and once;
/// malformed commands are refused and memory the VMM did not map faults.
#[test]
fn test_console_moves_printed_output_to_guest_memory() {
    let (_s, mut g) = vgpu_ready();
    let c = g.module_load(
        0,
        abi::MODULE_FORMAT_PTX,
        conformance::PRINTF_PTX.as_bytes(),
    );
    assert_status(c, abi::STATUS_OK);
    assert_eq!(c.result2 & abi::MODULE_FLAG_PRINTS, abi::MODULE_FLAG_PRINTS);
    let module = c.result;
    let out = g.device_alloc(0, 40 * 4);
    let mut launch = launch_cmd("say", [1, 1, 1], [40, 1, 1], 8);
    launch.module = module;
    assert_status(g.launch_raw(0, &launch, &out.to_le_bytes()), abi::STATUS_OK);
    let sg = g.alloc_sg(&[600, 700]);
    let list: Vec<u8> = sg.iter().flat_map(|e| e.as_slice().to_vec()).collect();
    let console = |module, out_size, sg_count| abi::ConsoleCmd {
        hdr: CmdHeader {
            opcode: abi::OP_CONSOLE,
            flags: 0,
        },
        module,
        out_size,
        sg_count,
    };
    let cmd = console(module, 1300, 2);
    let c = g.run(0, &Chain::command(&cmd).bytes(&list).completion());
    assert_status(c, abi::STATUS_OK);
    let text = g.read_sg(&sg);
    let mut lines: Vec<String> = String::from_utf8_lossy(&text[..c.result as usize])
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    let mut want: Vec<String> = (0..40)
        .map(|t| format!("thread {t} of 40: 1.500000 ok"))
        .collect();
    want.sort();
    assert_eq!(lines, want);
    assert_eq!(c.result2, 0, "nothing dropped");
    // Taken once.
    let c = g.run(0, &Chain::command(&cmd).bytes(&list).completion());
    assert_eq!((c.status, c.result), (abi::STATUS_OK, 0));
    for bad in [
        console(module, 0, 2),
        console(module, 1300, 0),
        console(module, 1299, 2),
        console(abi::MODULE_BUILTIN, 1300, 2),
        console(module, abi::CONSOLE_BYTES + 1, 2),
        abi::ConsoleCmd {
            hdr: CmdHeader {
                opcode: abi::OP_CONSOLE,
                flags: 1,
            },
            ..cmd
        },
    ] {
        let c = g.run(0, &Chain::command(&bad).bytes(&list).completion());
        assert_status(c, abi::STATUS_INVALID);
    }
    // Guest memory the VMM did not map.
    assert_status(g.launch_raw(0, &launch, &out.to_le_bytes()), abi::STATUS_OK);
    let nowhere = SgEntry {
        addr: g.unmapped_addr(),
        len: 1300,
    };
    let c = g.run(
        0,
        &Chain::command(&console(module, 1300, 1))
            .bytes(nowhere.as_slice())
            .completion(),
    );
    assert_status(c, abi::STATUS_FAULT);
    assert_status(g.nop(0), abi::STATUS_OK);
}
