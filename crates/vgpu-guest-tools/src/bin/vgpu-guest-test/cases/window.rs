//! The shared memory window.

use std::os::fd::AsRawFd;

use vgpu_guest::{errno_name, Batch};

use crate::proc;
use crate::{Args, CaseResult};

use super::{expect_errno, mib, open, open_path, rng, same, Ctx, KIB};

pub(super) fn window(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let wsize = dev.cached_info().window_size;
    if wsize == 0 {
        ensure!(
            args.expect_window.unwrap_or(0) == 0,
            "no window, expected one"
        );
        expect_errno(
            dev.map_window_range(0, 4096),
            libc::ENODEV,
            "mmap without a window",
        )?;
        return Ok("no window; mmap refused with ENODEV".into());
    }
    let w = dev.map_window().ctx("mmap")?;
    ensure!(w.len() as u64 == wsize, "mapped {} of {wsize}", w.len());
    let n = (64 * KIB).min(wsize) as usize;
    let pattern = rng(41).bytes(n);
    w.write(0, &pattern).ctx("write")?;
    let mut back = vec![0u8; n];
    w.read(0, &mut back).ctx("read")?;
    same(&back, &pattern, "window read back")?;
    // Last word of the window.
    let last = wsize as usize - 4;
    w.write_u32(last, 0xfeed_f00d).ctx("write")?;
    ensure!(w.read_u32(last).ctx("read")? == 0xfeed_f00d, "last word");
    // A second mapping of one page aliases the first.
    if wsize >= 8192 {
        let w2 = dev.map_window_range(4096, 4096).ctx("mmap of page 1")?;
        let mut p1 = vec![0u8; 4096];
        w2.read(0, &mut p1).ctx("read")?;
        same(&p1, &pattern[4096..8192.min(n)], "second mapping")?;
    }
    // window -> device -> host.
    let buf = dev.alloc(n as u64 + 4096).ctx("alloc")?;
    let mut bt = Batch::new();
    bt.copy_window_to_device(&buf, 4096, 0, n as u64);
    let slot = bt.copy_from_device(&buf, 4096, n);
    let done = dev.run(bt).ctx("window to device")?;
    same(done.read(slot), &pattern, "window copied to the device")?;
    // device -> window, seen through the mapping.
    let other = rng(42).bytes(4096);
    dev.copy_to_device(&buf, 0, &other).ctx("copy")?;
    let off = if wsize >= 3 * 4096 { 8192 } else { 0 };
    let mut bt = Batch::new();
    bt.copy_device_to_window(off as u64, &buf, 0, 4096);
    dev.run(bt).ctx("device to window")?;
    let mut seen = vec![0u8; 4096];
    w.read(off, &mut seen).ctx("read")?;
    same(&seen, &other, "device data in the window")?;
    // Another process sees the same window.
    let dev_path = args.device.clone();
    let mut child = proc::spawn(move |link| {
        let d = open_path(&dev_path)?;
        let cw = d.map_window().ctx("child mmap")?;
        let word = cw.read_u32(last).ctx("child read")?;
        cw.write_u32(last, !word).ctx("child write")?;
        link.send(&format!("{word:#x}"))?;
        Ok(String::new())
    })?;
    let seen_by_child = child.link().expect()?;
    child.join()?;
    ensure!(seen_by_child == "0xfeedf00d", "child read {seen_by_child}");
    ensure!(
        w.read_u32(last).ctx("read")? == !0xfeed_f00d,
        "child's write not seen"
    );
    // Refusals.
    expect_errno(
        dev.map_window_range(wsize, 4096),
        libc::EINVAL,
        "mmap past the window",
    )?;
    expect_errno(
        dev.map_window_range(0, wsize + 4096),
        libc::EINVAL,
        "mmap larger than the window",
    )?;
    // SAFETY: a new private mapping request chosen by the kernel; it is
    // expected to fail, and unmapped below if it does not.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            dev.as_raw_fd(),
            0,
        )
    };
    if p != libc::MAP_FAILED {
        // SAFETY: the mapping just created, 4096 bytes.
        unsafe { libc::munmap(p, 4096) };
        return Err("MAP_PRIVATE mapping accepted".into());
    }
    let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    ensure!(
        e == libc::EINVAL,
        "MAP_PRIVATE: {}, expected EINVAL",
        errno_name(e)
    );
    let mut bt = Batch::new();
    bt.copy_device_to_window(wsize - 4, &buf, 0, 8);
    expect_errno(dev.submit(bt), libc::ERANGE, "copy past the window")?;
    // Leave the window as it was found (zeroed).
    w.write(0, &vec![0u8; n]).ctx("clear")?;
    w.write(off, &[0u8; 4096]).ctx("clear")?;
    w.write_u32(last, 0).ctx("clear")?;
    Ok(format!(
        "{} window: mmap read/write, aliasing, window<->device copies, shared with a child, refusals",
        mib(wsize)
    ))
}
