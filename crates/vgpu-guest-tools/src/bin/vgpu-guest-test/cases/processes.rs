//! Several processes on one device: concurrent work, a failing neighbour, and what an exiting process leaves.

use std::time::Duration;

use vgpu_guest::vgpu_abi::{CopyParams, FillParams, SaxpyParams, SgemmParams, VaddParams};
use vgpu_guest::{sys, Batch, Device, Dims};
use vgpu_guest_tools::reference::{self, Rng};

use crate::proc::{self, poll_until};
use crate::{Args, CaseResult};

use super::{
    download_f32, expect_errno, mib, open, open_path, read_back, rng, same, upload_f32, Ctx, KIB,
    MIB,
};

/// Copies and kernels on a fresh file, checked against the CPU; returns
/// the number of checks done.
fn worker_round(dev: &Device, r: &mut Rng, n: usize) -> Result<(), String> {
    let x = r.f32s(n);
    let mut y = r.f32s(n);
    let a = r.next_f32() * 4.0;
    let dx = upload_f32(dev, &x)?;
    let dy = upload_f32(dev, &y)?;
    let dz = dev.alloc(n as u64 * 4).ctx("alloc")?;
    dev.run_kernel(&VaddParams {
        c: dz.addr(),
        a: dx.addr(),
        b: dy.addr(),
        n: n as u64,
    })
    .ctx("vadd")?;
    dev.run_kernel(&SaxpyParams {
        y: dy.addr(),
        x: dx.addr(),
        n: n as u64,
        a,
        reserved: 0,
    })
    .ctx("saxpy")?;
    let z = download_f32(dev, &dz)?;
    let (bad, worst, _) = reference::compare(&z, &reference::vadd(&x, &y), None, 1e-6, 1e-7);
    ensure!(bad == 0, "vadd: {bad} differ (worst {worst:e})");
    reference::saxpy(a, &x, &mut y);
    let got = download_f32(dev, &dy)?;
    let (bad, worst, _) = reference::compare(&got, &y, None, 1e-6, 1e-6);
    ensure!(bad == 0, "saxpy: {bad} differ (worst {worst:e})");
    let bytes = r.bytes(n * 4 + 3);
    let raw = dev.alloc(bytes.len() as u64).ctx("alloc")?;
    dev.copy_to_device(&raw, 0, &bytes).ctx("copy")?;
    same(&read_back(dev, &raw)?, &bytes, "copy")?;
    Ok(())
}

pub(super) fn multiprocess(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let base = dev.usage().ctx("USAGE")?;
    let procs = args.procs.max(1);
    let rounds = 3;
    let mut kids = Vec::new();
    for i in 0..procs {
        let path = args.device.clone();
        kids.push(proc::spawn(move |link| {
            let d = open_path(&path)?;
            link.send("ready")?;
            ensure!(link.expect()? == "go", "no go");
            let mut r = rng(100 + i as u64);
            for round in 0..rounds {
                worker_round(&d, &mut r, 16_384 + i * 1000 + round)
                    .map_err(|e| format!("round {round}: {e}"))?;
            }
            Ok(String::new())
        })?);
    }
    for k in &mut kids {
        let m = k.link().expect()?;
        ensure!(m == "ready", "child said {m:?}");
    }
    let u = dev.usage().ctx("USAGE")?;
    let files = u.open_files;
    let seen = u.processes;
    for k in &mut kids {
        k.link().send("go")?;
    }
    let mut errors = Vec::new();
    for (i, k) in kids.into_iter().enumerate() {
        if let Err(e) = k.join() {
            errors.push(format!("child {i}: {e}"));
        }
    }
    ensure!(errors.is_empty(), "{}", errors.join("; "));
    ensure!(
        seen == base.processes + procs as u32 && files == base.open_files + procs as u32,
        "with {procs} children open: {seen} processes and {files} files (before: {} and {})",
        base.processes,
        base.open_files
    );
    let u = poll_until(Duration::from_secs(10), || {
        let u = dev.usage().ok()?;
        (u.open_files == base.open_files && u.mem_used == base.mem_used).then_some(u)
    });
    ensure!(u.is_some(), "files or memory of the children not released");
    Ok(format!(
        "{procs} processes x {rounds} rounds of copies, vadd and saxpy; {seen} processes seen"
    ))
}

/// One process's commands that fail (refused, or failed by the device)
/// leave another process, working at the same time, unharmed.
pub(super) fn fault_isolation(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let before = dev.usage().ctx("USAGE")?;
    let path = args.device.clone();
    let mut victim = proc::spawn(move |link| {
        let d = open_path(&path)?;
        let secret = d.alloc(MIB).ctx("alloc")?;
        let pattern = rng(51).bytes(MIB as usize);
        d.copy_to_device(&secret, 0, &pattern).ctx("copy")?;
        link.send(&format!("{:#x}", secret.addr()))?;
        let mut r = rng(52);
        let mut rounds = 0;
        // Work until the parent is done misbehaving.
        loop {
            worker_round(&d, &mut r, 8192).map_err(|e| format!("round {rounds}: {e}"))?;
            rounds += 1;
            if link.ready() {
                break;
            }
        }
        ensure!(link.expect()? == "stop", "unexpected message");
        same(&read_back(&d, &secret)?, &pattern, "victim's memory")?;
        Ok(format!("{rounds}"))
    })?;
    let addr_s = victim.link().expect()?;
    let vaddr = u64::from_str_radix(addr_s.trim_start_matches("0x"), 16)
        .map_err(|e| format!("{addr_s:?}: {e}"))?;
    let own = dev.alloc(MIB).ctx("alloc")?;
    // Where each process has a device context of its own, each has its
    // own addresses too: the victim's may be one of ours, which names
    // our memory. Then an address next to ours stands for it, one we do
    // not own either; the victim's data is checked at the end anyway.
    let vaddr = if (own.addr()..own.addr() + MIB).contains(&vaddr) {
        own.addr() + MIB
    } else {
        vaddr
    };
    let junk = vec![0x5au8; 4096];
    let mut out = vec![0u8; 4096];
    let mut checks = Vec::new();
    let mut check = |r: vgpu_guest::Result<()>, errno: i32, what: &str| -> Result<(), String> {
        checks.push(what.to_string());
        expect_errno(r, errno, what)
    };
    check(
        dev.copy_to_device_addr(vaddr, &junk),
        libc::ENOENT,
        "copy into another process's memory",
    )?;
    check(
        dev.copy_from_device_addr(vaddr, &mut out),
        libc::ENOENT,
        "copy from another process's memory",
    )?;
    let mut bt = Batch::new();
    bt.fill_addr(vaddr, 4096, 0);
    check(
        dev.submit(bt).map(drop),
        libc::ENOENT,
        "fill of another process's memory",
    )?;
    check(
        dev.run_kernel(&FillParams {
            dst: vaddr,
            count: 16,
            value: 0,
            reserved: 0,
        })
        .map(drop),
        libc::ENOENT,
        "fill_u32 on another process's memory",
    )?;
    check(
        dev.run_kernel(&CopyParams {
            dst: own.addr(),
            src: vaddr,
            bytes: 4096,
        })
        .map(drop),
        libc::ENOENT,
        "copy kernel reading another process's memory",
    )?;
    let mut bt = Batch::new();
    bt.copy_device_addr(own.addr(), vaddr, 16);
    check(
        dev.submit(bt).map(drop),
        libc::ENOENT,
        "device copy from another process's memory",
    )?;
    // A user address that is not mapped: the driver cannot pin it.
    let mut cmd = [sys::VgpuCmd::copy(sys::VgpuCopyArgs {
        src_kind: sys::MEM_USER,
        dst_kind: sys::MEM_DEVICE,
        src: 0x1000,
        dst: own.addr(),
        size: 4096,
    })];
    // SAFETY: the user side is an unmapped address the driver cannot pin;
    // nothing of this process is read or written.
    let r = unsafe { dev.run_raw(&mut cmd) };
    check(r, libc::EFAULT, "copy from an unmapped user address")?;
    // Commands the device fails.
    for shape in [[0u32, 1, 1], [1, 1, 0]] {
        let r = dev.launch_builtin_dims(
            "fill_u32",
            Dims {
                grid: shape,
                ..Dims::default()
            },
            &FillParams {
                dst: own.addr(),
                count: 16,
                value: 1,
                reserved: 0,
            },
        );
        check(r.map(drop), libc::EINVAL, "launch with a zero dimension")?;
    }
    // This process still works too.
    let data = rng(53).bytes(4096);
    dev.copy_to_device(&own, 0, &data)
        .ctx("copy after the faults")?;
    dev.copy_from_device(&own, 0, &mut out)
        .ctx("copy after the faults")?;
    same(&out, &data, "own data after the faults")?;
    victim.link().send("stop")?;
    let rounds = victim.join().map_err(|e| format!("victim: {e}"))?;
    let after = dev.usage().ctx("USAGE")?;
    ensure!(
        after.recoveries == before.recoveries,
        "the driver recovered {} time(s)",
        after.recoveries - before.recoveries
    );
    Ok(format!(
        "{} refusals/failures; victim did {rounds} round(s) meanwhile and kept its data; no recovery needed",
        checks.len()
    ))
}

/// Memory of a process that exits, or is killed with work queued, is
/// freed by the driver.
pub(super) fn process_exit(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let base = dev.usage().ctx("USAGE")?;
    let size = (dev.cached_info().mem_size / 8).clamp(4 * KIB, 64 * MIB);
    // Exits without freeing.
    let path = args.device.clone();
    let child = proc::spawn(move |_| {
        let d = open_path(&path)?;
        let b = d.alloc(size).ctx("alloc")?;
        d.fill(&b, 0, size, 0x1111_1111).ctx("fill")?;
        let _ = b.into_raw();
        Ok(String::new())
    })?;
    child.join()?;
    let freed = poll_until(Duration::from_secs(10), || {
        let u = dev.usage().ok()?;
        (u.mem_used == base.mem_used && u.open_files == base.open_files).then_some(())
    });
    ensure!(freed.is_some(), "memory of an exited process not freed");
    // Killed with work queued.
    let path = args.device.clone();
    let mut child = proc::spawn(move |link| {
        let d = open_path(&path)?;
        let b = d.alloc(size).ctx("alloc")?;
        let m = 512u32;
        let mat = d.alloc(u64::from(m * m) * 4).ctx("alloc")?;
        let mut pend = Vec::new();
        for _ in 0..4 {
            let mut bt = Batch::new();
            bt.fill(&b, 0, size, 0x2222_2222).run_kernel(&SgemmParams {
                c: mat.addr(),
                a: mat.addr(),
                b: mat.addr(),
                m,
                n: m,
                k: m,
                reserved: 0,
                alpha: 1.0,
                beta: 0.0,
            });
            pend.push(d.submit(bt).ctx("submit")?);
        }
        link.send("queued")?;
        std::thread::sleep(Duration::from_secs(60));
        std::mem::forget(pend);
        Ok(String::new())
    })?;
    ensure!(
        child.link().expect()? == "queued",
        "child did not queue work"
    );
    let during = dev.usage().ctx("USAGE")?;
    child.kill();
    let status = child.reap_killed()?;
    ensure!(
        libc::WIFSIGNALED(status),
        "child not killed (status {status:#x})"
    );
    let freed = poll_until(Duration::from_secs(30), || {
        let u = dev.usage().ok()?;
        (u.mem_used == base.mem_used && u.open_files == base.open_files).then_some(u)
    });
    ensure!(
        freed.is_some(),
        "memory of a killed process not freed (mem_used {} -> {})",
        base.mem_used,
        dev.usage().map(|u| u.mem_used).unwrap_or(0)
    );
    // The function still works.
    let b = dev.alloc(size).ctx("alloc after the kill")?;
    let head = read_back(&dev, &b)?;
    ensure!(
        head.iter().all(|x| *x == 0),
        "memory of the killed process reached a new allocation"
    );
    Ok(format!(
        "{} freed after exit; {} and queued work freed after SIGKILL ({} in use while it lived)",
        mib(size),
        mib(size),
        mib(during.mem_used.saturating_sub(base.mem_used))
    ))
}
