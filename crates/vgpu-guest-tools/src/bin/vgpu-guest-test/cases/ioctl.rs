//! The driver's checks of ioctl arguments.

use vgpu_guest::sys;

use crate::{Args, CaseResult};

use super::{expect_errno, open, Ctx};

/// A pointer to `x` for an ioctl argument.
fn ptr<T>(x: &mut T) -> *mut libc::c_void {
    x as *mut T as *mut libc::c_void
}

/// Driver ioctl argument checks.
pub(super) fn bad_ioctl(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let mut big = vec![0u64; 64];
    let bigp = big.as_mut_ptr() as *mut libc::c_void;
    let bad_ptr = 8usize as *mut libc::c_void;
    let magic = sys::IOCTL_MAGIC;
    let ioc = sys::ioc;
    let raw = |req: u64, p: *mut libc::c_void| {
        // SAFETY: used only in this function, where the argument is
        // `big` (512 writable bytes, more than any size these requests
        // encode), a live local structure of the request's type whose
        // pointers are valid or rejected before use, NULL, or an unmapped
        // address in the first page, which the kernel's uaccess helpers
        // reject without touching this process's memory.
        unsafe { dev.ioctl_raw(req, p) }
    };
    let mut n = 0;
    let mut check = |r: vgpu_guest::Result<()>, errno: i32, what: &str| {
        n += 1;
        expect_errno(r, errno, what)
    };
    check(
        raw(ioc(sys::IOC_READ, magic, 0xbf, 8), bigp),
        libc::ENOTTY,
        "unknown number",
    )?;
    check(
        raw(ioc(sys::IOC_READ, magic, 0x01, 8), bigp),
        libc::ENOTTY,
        "number below ours",
    )?;
    check(
        raw(ioc(sys::IOC_READ, b'W', 0xa0, 104), bigp),
        libc::ENOTTY,
        "other magic",
    )?;
    check(raw(0, bigp), libc::ENOTTY, "ioctl 0")?;
    check(
        raw(ioc(sys::IOC_READ, magic, 0xa0, 8), bigp),
        libc::EINVAL,
        "INFO with the wrong size",
    )?;
    check(
        raw(ioc(sys::IOC_WRITE, magic, 0xa0, 104), bigp),
        libc::EINVAL,
        "INFO with the wrong direction",
    )?;
    check(
        raw(ioc(sys::IOC_READ | sys::IOC_WRITE, magic, 0xa3, 48), bigp),
        libc::EINVAL,
        "SUBMIT with the wrong size",
    )?;
    check(
        raw(sys::IOCTL_INFO, bad_ptr),
        libc::EFAULT,
        "INFO to a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_USAGE, std::ptr::null_mut()),
        libc::EFAULT,
        "USAGE to NULL",
    )?;
    check(
        raw(sys::IOCTL_ALLOC, bad_ptr),
        libc::EFAULT,
        "ALLOC from a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_SUBMIT, bad_ptr),
        libc::EFAULT,
        "SUBMIT from a bad pointer",
    )?;
    check(
        raw(sys::IOCTL_WAIT, bad_ptr),
        libc::EFAULT,
        "WAIT from a bad pointer",
    )?;
    // Structures with bad fields.
    let mut alloc = sys::VgpuAlloc {
        size: 4096,
        flags: 1,
        ..Default::default()
    };
    check(
        raw(sys::IOCTL_ALLOC, ptr(&mut alloc)),
        libc::EINVAL,
        "ALLOC with flags",
    )?;
    alloc.flags = 0;
    alloc.pad = 1;
    check(
        raw(sys::IOCTL_ALLOC, ptr(&mut alloc)),
        libc::EINVAL,
        "ALLOC with padding set",
    )?;
    let mut cmds = [sys::VgpuCmd::bare(sys::CMD_NOP, 0); 2];
    let mut submit = sys::VgpuSubmit {
        cmds: cmds.as_mut_ptr() as u64,
        count: 0,
        ..Default::default()
    };
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EINVAL,
        "SUBMIT of 0 commands",
    )?;
    submit.count = sys::MAX_BATCH_CMDS + 1;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::E2BIG,
        "SUBMIT of 257 commands",
    )?;
    submit.count = 1;
    submit.flags = 0x80;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EINVAL,
        "SUBMIT with unknown flags",
    )?;
    submit.flags = 0;
    submit.cmds = 0x10;
    check(
        raw(sys::IOCTL_SUBMIT, ptr(&mut submit)),
        libc::EFAULT,
        "SUBMIT of an unreadable command array",
    )?;
    let mut bad_cmd = |cmd: sys::VgpuCmd, errno: i32, what: &str| {
        let mut c = [cmd];
        // SAFETY: none of these commands has user pointers.
        check(unsafe { dev.run_raw(&mut c) }, errno, what)
    };
    let mut nop = sys::VgpuCmd::bare(sys::CMD_NOP, 0);
    nop.args.raw = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    bad_cmd(nop, libc::EINVAL, "NOP with argument bytes set")?;
    bad_cmd(
        sys::VgpuCmd::bare(sys::CMD_NOP, 1),
        libc::EINVAL,
        "NOP with flags",
    )?;
    bad_cmd(
        sys::VgpuCmd::bare(2, 0),
        libc::EINVAL,
        "opcode 2 (MEM_ALLOC) in a batch",
    )?;
    bad_cmd(sys::VgpuCmd::bare(99, 0), libc::EINVAL, "opcode 99")?;
    bad_cmd(
        sys::VgpuCmd::bare(sys::CMD_FENCE, 2),
        libc::EINVAL,
        "FENCE with an unknown flag",
    )?;
    bad_cmd(
        sys::VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: sys::MEM_USER,
            dst_kind: sys::MEM_USER,
            src: 0,
            dst: 0,
            size: 4,
        }),
        libc::EINVAL,
        "COPY user to user",
    )?;
    bad_cmd(
        sys::VgpuCmd::copy(sys::VgpuCopyArgs {
            src_kind: 7,
            dst_kind: sys::MEM_DEVICE,
            src: 0,
            dst: 0,
            size: 4,
        }),
        libc::EINVAL,
        "COPY of an unknown memory kind",
    )?;
    // WAIT checks.
    let mut wait = sys::VgpuWait::default();
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT of fence 0",
    )?;
    wait.fence = 1 << 40;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT of a fence never issued",
    )?;
    wait.fence = 1;
    wait.count = 1;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT with a count and no array",
    )?;
    wait.count = 0;
    wait.flags = 4;
    check(
        raw(sys::IOCTL_WAIT, ptr(&mut wait)),
        libc::EINVAL,
        "WAIT with unknown flags",
    )?;
    // Still fine afterwards.
    dev.synchronize().ctx("synchronize after the bad calls")?;
    let _ = &mut big;
    Ok(format!(
        "{n} bad calls refused (ENOTTY, EINVAL, EFAULT, E2BIG)"
    ))
}
