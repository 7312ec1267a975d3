//! Isolation between guests: what one leaves in its vGPU never shows in another's.

use std::time::Duration;

use crate::{Args, CaseResult};

use super::{mib, open, words, Ctx, KIB, MIB};

pub(super) fn isolation_write(args: &Args) -> CaseResult {
    let magic = args.isolation_write.unwrap_or(0x5a5a_5a5a);
    let dev = open(args)?;
    let info = *dev.cached_info();
    let want = args.isolation_bytes.unwrap_or(info.mem_size / 2);
    let chunk = (16 * MIB).min(want.max(4 * KIB));
    let mut held = Vec::new();
    let mut total = 0;
    while total < want {
        let n = chunk.min(want - total).max(4) & !3;
        match dev.alloc(n) {
            Ok(b) => {
                dev.fill(&b, 0, n, magic).ctx("fill")?;
                total += n;
                held.push(b);
            }
            Err(e) if e.is_out_of_memory() => break,
            Err(e) => return Err(format!("alloc: {e}")),
        }
    }
    ensure!(!held.is_empty(), "could not allocate any memory");
    // Also through a copy from this process, and read some of it back.
    let first = &held[0];
    let host: Vec<u8> = std::iter::repeat_n(
        magic.to_le_bytes(),
        (first.size() / 4).min(MIB / 4) as usize,
    )
    .flatten()
    .collect();
    dev.copy_to_device(first, 0, &host).ctx("copy")?;
    for b in &held {
        let mut head = vec![0u8; 4096.min(b.size() as usize)];
        dev.copy_from_device(b, b.size() - head.len() as u64, &mut head)
            .ctx("read back")?;
        ensure!(
            words(&head).all(|w| w == magic),
            "pattern not in device memory"
        );
    }
    let mut wdetail = "no window".to_string();
    if info.window_size > 0 {
        let w = dev.map_window().ctx("mmap")?;
        let page: Vec<u8> = std::iter::repeat_n(magic.to_le_bytes(), 1024)
            .flatten()
            .collect();
        for off in (0..w.len()).step_by(4096) {
            let n = 4096.min(w.len() - off);
            w.write(off, &page[..n]).ctx("window write")?;
        }
        ensure!(
            w.read_u32(w.len() - 4).ctx("read")? == magic,
            "window write not seen"
        );
        wdetail = format!("{} of window", mib(w.len() as u64));
        // The mapping goes; the data stays in the window.
    }
    // The point another guest may start its check: the pattern is in
    // place and stays (allocated) for `hold` seconds.
    println!(
        "VGPU-ISOLATION WRITTEN magic={magic:#010x} device_bytes={total} window_bytes={} hold={}",
        info.window_size, args.hold
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    if args.hold > 0 {
        std::thread::sleep(Duration::from_secs(args.hold));
    }
    Ok(format!(
        "magic {magic:#010x} in {} of device memory and {wdetail}",
        mib(total)
    ))
}

pub(super) fn isolation_check(args: &Args) -> CaseResult {
    let magic = args.isolation_check.unwrap_or(0x5a5a_5a5a);
    let dev = open(args)?;
    let info = *dev.cached_info();
    let used_before = dev.usage().ctx("USAGE")?.mem_held();
    // Take everything: big chunks, then smaller ones for the rest.
    let mut held = Vec::new();
    let mut total = 0u64;
    let mut chunk = 16 * MIB;
    while chunk >= 4 * KIB {
        match dev.alloc(chunk) {
            Ok(b) => {
                total += chunk;
                held.push(b);
            }
            Err(e) if e.is_out_of_memory() => chunk /= 4,
            Err(e) => return Err(format!("alloc: {e}")),
        }
    }
    let free = info.mem_size.saturating_sub(used_before);
    ensure!(
        total + 16 * KIB > free,
        "only {total} of {free} free bytes could be allocated"
    );
    let mut host = vec![0u8; 16 * MIB as usize];
    let (mut nonzero, mut found) = (0u64, 0u64);
    let mut first_bad = None;
    for b in &held {
        let n = b.size() as usize;
        dev.copy_from_device(b, 0, &mut host[..n])
            .ctx("read back")?;
        for (i, w) in words(&host[..n]).enumerate() {
            if w != 0 {
                nonzero += 1;
                if w == magic {
                    found += 1;
                }
                first_bad.get_or_insert((b.addr() + 4 * i as u64, w));
            }
        }
    }
    let mut wdetail = "no window".to_string();
    let (mut wfound, mut wnonzero) = (0u64, 0u64);
    if info.window_size > 0 {
        let w = dev.map_window().ctx("mmap")?;
        let mut page = vec![0u8; 64 * KIB as usize];
        for off in (0..w.len()).step_by(page.len()) {
            let n = page.len().min(w.len() - off);
            w.read(off, &mut page[..n]).ctx("window read")?;
            for x in words(&page[..n]) {
                wfound += u64::from(x == magic);
                wnonzero += u64::from(x != 0);
            }
        }
        wdetail = format!(
            "{} of window: {wfound} magic, {wnonzero} non-zero word(s)",
            mib(w.len() as u64)
        );
    }
    ensure!(
        found == 0 && wfound == 0,
        "MAGIC {magic:#010x} seen: {found} word(s) in device memory, {wfound} in the window"
    );
    ensure!(
        nonzero == 0,
        "{nonzero} non-zero word(s) in fresh device memory, first {:x?}",
        first_bad
    );
    Ok(format!(
        "{} of device memory ({} allocations) all zero; {wdetail}",
        mib(total),
        held.len()
    ))
}
