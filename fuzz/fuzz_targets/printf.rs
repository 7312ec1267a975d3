//! The device `printf` formatter (`vgpu_ptx::printf::vprintf`) over a
//! kernel's memory made of arbitrary bytes: the format and the argument
//! buffer at addresses the input chooses. It returns a count or an
//! error code and never panics; its text stays within `MAX_OUTPUT`, and
//! it reads only inside the memory it is given.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_ptx::printf::{vprintf, MAX_OUTPUT};

const BASE: u64 = 0x1000;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    // The first two bytes place the format and the arguments in memory
    // (or, at 0xff, outside it).
    let mem = &data[2..];
    let at = |b: u8| {
        if b == 0xff {
            BASE + mem.len() as u64 + 16
        } else {
            BASE + u64::from(b) % (mem.len() as u64 + 1)
        }
    };
    let (fmt, args) = (at(data[0]), at(data[1]));
    let mut read = |addr: u64, buf: &mut [u8]| {
        let Some(off) = addr.checked_sub(BASE) else {
            return false;
        };
        let Some(end) = off.checked_add(buf.len() as u64) else {
            return false;
        };
        if end > mem.len() as u64 {
            return false;
        }
        buf.copy_from_slice(&mem[off as usize..end as usize]);
        true
    };
    let mut out = Vec::new();
    let r = vprintf(fmt, args, &mut read, &mut out);
    assert!(r >= -2, "returned {r}");
    assert!(out.len() <= MAX_OUTPUT, "{} bytes of output", out.len());
    if r < 0 {
        assert!(out.is_empty(), "a failed call printed");
    }
});
