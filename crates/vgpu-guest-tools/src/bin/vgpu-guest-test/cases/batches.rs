//! Batches of commands, their errors, and loaded modules.

use std::time::Duration;

use vgpu_guest::vgpu_abi::{self, FillParams, SaxpyParams, SgemmParams};
use vgpu_guest::{errno_name, sys, Batch, Dims, Error};
use vgpu_guest_tools::reference::{bytes_f32, f32_bytes};

use crate::{Args, CaseResult};

use super::{expect_errno, open, read_back, rng, words, Ctx};

pub(super) fn batch(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let has_ts = dev.cached_info().features & vgpu_abi::FEATURE_TIMESTAMP != 0;
    let n = 4096usize;
    let a = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let b = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let x = dev.alloc(n as u64 * 4).ctx("alloc")?;
    let mut r = rng(31);
    let xs = r.f32s(n);
    let mut b1 = Batch::new();
    let t0 = if has_ts { Some(b1.timestamp()) } else { None };
    b1.fill(&a, 0, n as u64 * 4, 2.0f32.to_bits())
        .copy_to_device(&x, 0, &f32_bytes(&xs))
        .copy_device(&b, 0, &a, 0, n as u64 * 4)
        .run_kernel(&SaxpyParams {
            y: b.addr(),
            x: x.addr(),
            n: n as u64,
            a: 3.0,
            reserved: 0,
        })
        .nop()
        .fence(true);
    let slot = b1.copy_from_device(&b, 0, n * 4);
    let t1 = if has_ts { Some(b1.timestamp()) } else { None };
    let count = b1.len();
    let mut p = dev.submit(b1).ctx("submit")?;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected >= 1 || p.is_collected(),
        "submitted batch not counted as uncollected"
    );
    let done = p.wait(Some(Duration::from_secs(30))).ctx("wait")?;
    done.check().ctx("batch")?;
    let got = bytes_f32(done.read(slot));
    for (i, (g, xv)) in got.iter().zip(&xs).enumerate() {
        let want = 3.0 * xv + 2.0;
        ensure!(
            (g - want).abs() <= 1e-6 * want.abs().max(1.0),
            "element {i}: {g}, expected {want}"
        );
    }
    let mut ts = String::new();
    if let (Some(i0), Some(i1)) = (t0, t1) {
        let (c0, c1) = (
            done.result(i0).unwrap_or_default().result,
            done.result(i1).unwrap_or_default().result,
        );
        ensure!(c1 >= c0, "TIMESTAMP went back: {c0} then {c1}");
        ts = format!(", timestamps {} ns apart", c1 - c0);
    }
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected == 0,
        "{} uncollected after wait",
        u.file_uncollected
    );

    // Several batches in flight, collected in reverse order.
    let mut pend = Vec::new();
    for i in 0..8u32 {
        let mut bt = Batch::new();
        bt.fill(&a, u64::from(i) * 16, 16, i);
        pend.push(dev.submit(bt).ctx("submit")?);
    }
    let fences: Vec<u64> = pend.iter().map(|p| p.fence()).collect();
    ensure!(
        fences.windows(2).all(|w| w[1] == w[0] + 1),
        "fences {fences:?}"
    );
    for p in pend.iter_mut().rev() {
        p.wait(Some(Duration::from_secs(30)))
            .ctx("wait")?
            .check()
            .ctx("batch")?;
    }
    let back = read_back(&dev, &a)?;
    for i in 0..8u32 {
        let w: Vec<u32> = words(&back[i as usize * 16..i as usize * 16 + 16]).collect();
        ensure!(w == [i; 4], "batch {i} wrote {w:?}");
    }
    // Polling: a zero timeout either collects or times out, never blocks.
    let big = 256u32;
    let ma = dev.alloc(u64::from(big * big) * 4).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.run_kernel(&SgemmParams {
        c: ma.addr(),
        a: ma.addr(),
        b: ma.addr(),
        m: big,
        n: big,
        k: big,
        reserved: 0,
        alpha: 1.0,
        beta: 0.0,
    });
    let mut p = dev.submit(bt).ctx("submit")?;
    let polled = match p.wait(Some(Duration::ZERO)) {
        Ok(d) => {
            d.check().ctx("sgemm")?;
            "done at once"
        }
        Err(Error::TimedOut) => {
            p.wait(None).ctx("wait")?.check().ctx("sgemm")?;
            "timed out, then done"
        }
        Err(e) => return Err(format!("poll: {e}")),
    };
    // A dropped Pending waits for its batch.
    let mut bt = Batch::new();
    let s2 = bt.copy_from_device(&b, 0, 16);
    let _ = s2;
    drop(dev.submit(bt).ctx("submit")?);
    dev.synchronize().ctx("synchronize")?;
    let u = dev.usage().ctx("USAGE")?;
    ensure!(
        u.file_uncollected == 0 && u.file_inflight == 0,
        "left over: {u:?}"
    );
    Ok(format!(
        "{count} commands in one batch{ts}; 8 in flight collected in reverse; poll: {polled}"
    ))
}

pub(super) fn batch_errors(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let a = dev.alloc(4096).ctx("alloc")?;
    let b = dev.alloc(4096).ctx("alloc")?;
    // A failing command in the middle does not stop the ones after it.
    let mut bt = Batch::new();
    bt.fill(&a, 0, 4096, 7)
        .launch_builtin_dims(
            "fill_u32",
            Dims {
                grid: [0, 1, 1],
                ..Dims::default()
            },
            &FillParams {
                dst: a.addr(),
                count: 1,
                value: 0,
                reserved: 0,
            },
        )
        .fill(&b, 0, 4096, 9);
    let mut p = dev.submit(bt).ctx("submit")?;
    let done = p.wait(None).ctx("wait")?;
    let res = done.results();
    ensure!(
        res[0].status == 0
            && res[1].status == sys::CMD_STATUS_INVALID
            && res[1].error == -libc::EINVAL
            && res[2].status == 0,
        "results {res:?}"
    );
    match done.check() {
        Err(Error::Command { index: 1, .. }) => {}
        other => return Err(format!("check: {other:?}, expected command 1 failed")),
    }
    ensure!(
        words(&read_back(&dev, &b)?).all(|w| w == 9),
        "the command after the failure did not run"
    );
    // A refused batch queues nothing.
    let c = dev.alloc(4096).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.fill(&c, 0, 4096, 5)
        .nop()
        .copy_device_addr(a.addr(), 0x40, 16);
    match dev.submit(bt) {
        Err(Error::Rejected { index: 2, source }) if source.errno() == libc::ENOENT => {}
        other => {
            return Err(format!(
                "refused batch: {other:?}, expected command 2 refused with ENOENT"
            ))
        }
    }
    ensure!(
        read_back(&dev, &c)?.iter().all(|x| *x == 0),
        "a refused batch ran its first command"
    );
    // A builder error is reported at submit.
    let mut bt = Batch::new();
    bt.fill(&c, 4000, 200, 1);
    expect_errno(dev.submit(bt), libc::ERANGE, "fill outside the buffer")?;
    // Wait on a collected batch.
    let mut bt = Batch::new();
    bt.nop();
    let mut p = dev.submit(bt).ctx("submit")?;
    p.wait(None).ctx("wait")?;
    ensure!(
        p.wait(None).is_err(),
        "second wait on a collected batch succeeded"
    );
    // A full batch of 256 commands.
    let mut bt = Batch::new();
    for i in 0..sys::MAX_BATCH_CMDS {
        bt.fill(&c, u64::from(i % 1024) * 4, 4, i);
    }
    dev.run(bt).ctx("256 commands")?;
    Ok("failed command does not stop the batch; refused batch queues nothing; 256 commands".into())
}

pub(super) fn module(args: &Args) -> CaseResult {
    const PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n\n.visible .entry vgpu_nop()\n{\n\tret;\n}\n";
    let dev = open(args)?;
    expect_errno(
        {
            let mut cmd = [sys::VgpuCmd::module_unload(0x1234)];
            // SAFETY: MODULE_UNLOAD has no user pointers.
            unsafe { dev.run_raw(&mut cmd) }
        },
        libc::ENOENT,
        "unload of a module never loaded",
    )?;
    expect_errno(
        {
            let mut cmd = [sys::VgpuCmd::module_unload(sys::MODULE_BUILTIN_ID)];
            // SAFETY: MODULE_UNLOAD has no user pointers.
            unsafe { dev.run_raw(&mut cmd) }
        },
        libc::EINVAL,
        "unload of the built-in module",
    )?;
    let launch_unknown = {
        let mut cmd = [sys::VgpuCmd::launch(sys::VgpuLaunchArgs {
            module: 777,
            grid: [1, 1, 1],
            block: [1, 1, 1],
            entry: sys::entry_name("vgpu_nop").unwrap_or_default(),
            ..Default::default()
        })];
        // SAFETY: no parameter block, no user pointers.
        unsafe { dev.run_raw(&mut cmd) }
    };
    expect_errno(
        launch_unknown,
        libc::ENOENT,
        "launch of a module never loaded",
    )?;
    match dev.module_load(PTX.as_bytes()) {
        Ok(m) => {
            let u = dev.usage().ctx("USAGE")?;
            ensure!(
                u.file_modules == 1,
                "{} modules after a load",
                u.file_modules
            );
            dev.launch(&m, "vgpu_nop", Dims::default(), &[])
                .ctx("launch of the loaded module")?;
            let h = m.handle();
            drop(m);
            let u = dev.usage().ctx("USAGE")?;
            ensure!(
                u.file_modules == 0,
                "{} modules after unload",
                u.file_modules
            );
            Ok(format!("loaded (handle {h:#x}), launched, unloaded"))
        }
        Err(e) if e.errno() == libc::EOPNOTSUPP => Ok(
            "this backend does not run loaded modules (EOPNOTSUPP); unknown handles refused".into(),
        ),
        Err(e) => Err(format!("MODULE_LOAD: {e} ({})", errno_name(e.errno()))),
    }
}
