//! Lanes and values: a lane's commands go to another queue, on its
//! owner's resources, and wait on the device for a word another queue
//! writes.

use std::time::Duration;

use vgpu_guest::{sys, vgpu_abi, Batch};

use super::memory::Mapping;
use super::*;
use crate::{Args, CaseResult};

pub(super) fn lanes(args: &Args) -> CaseResult {
    let dev = open(args)?;
    let info = dev.cached_info();
    if info.features & vgpu_abi::FEATURE_VALUES == 0 {
        return Ok("skipped: the device has no WRITE_VALUE / WAIT_VALUE".into());
    }
    let (lane, queue) = dev.lane().ctx("lane")?;
    ensure!(
        queue < info.queues,
        "the lane's queue {queue} is not one of the {} in use",
        info.queues
    );
    // The lane works on its owner's memory; resources stay the owner's.
    let buf = dev.alloc(4096).ctx("alloc")?;
    expect_errno(lane.alloc(4096), libc::EINVAL, "alloc on a lane")?;
    expect_errno(lane.lane(), libc::EINVAL, "a lane of a lane")?;
    let mut sync = Mapping::new(4096)?;
    expect_errno(lane.pin(sync.ptr, 4096), libc::EINVAL, "pin on a lane")?;
    dev.pin(sync.ptr, 4096).ctx("pin")?;
    let word = sync.ptr;

    // The lane waits on the device for the owner's write, then fills.
    let mut waits = Batch::new();
    waits
        .wait_value(word, 1, sys::CMD_WAIT_GEQ, true)
        .fill(&buf, 0, 4096, 0x0707_0707);
    let mut pending = lane.submit(waits).ctx("lane submit")?;
    std::thread::sleep(Duration::from_millis(200));
    let early = pending.wait(Some(Duration::ZERO));
    ensure!(
        early.is_err(),
        "the lane's wait completed before the word was written"
    );
    // Meanwhile the owner's queue runs: it fills, then writes the word.
    let mut writes = Batch::new();
    writes
        .fill(&buf, 0, 4096, 0x0101_0101)
        .write_value(word, 1, true);
    dev.run(writes).ctx("owner's write")?;
    let done = pending.wait(Some(Duration::from_secs(30))).ctx("lane")?;
    done.check().ctx("lane's commands")?;
    let got = read_back(&dev, &buf)?;
    ensure!(
        words(&got).all(|w| w == 0x0707_0707),
        "the lane's fill did not come after the owner's"
    );
    ensure!(
        sync.bytes()[..8] == 1u64.to_le_bytes(),
        "the word reads {:?}",
        &sync.bytes()[..8]
    );

    // A 32-bit word, written by the lane, waited for by the owner.
    let mut b = Batch::new();
    b.wait_value(word.wrapping_add(8), 5, sys::CMD_WAIT_EQ, false);
    let owner_wait = dev.submit(b).ctx("owner's wait")?;
    let mut b = Batch::new();
    b.write_value(word.wrapping_add(8), 5, false);
    lane.run(b).ctx("lane's write")?;
    let mut owner_wait = owner_wait;
    owner_wait
        .wait(Some(Duration::from_secs(30)))
        .ctx("owner's wait")?
        .check()
        .ctx("owner's wait")?;

    // Words outside pinned memory, or misaligned, are refused.
    let mut other = Mapping::new(4096)?;
    let mut b = Batch::new();
    b.write_value(other.bytes().as_ptr(), 1, true);
    expect_errno(dev.run(b), libc::EFAULT, "a word outside pinned memory")?;
    let mut b = Batch::new();
    b.write_value(word.wrapping_add(4), 1, true);
    expect_errno(dev.run(b), libc::EINVAL, "a misaligned word")?;
    // A lane's value commands use its owner's pinned ranges.
    let mut b = Batch::new();
    b.write_value(word, 2, true);
    lane.run(b).ctx("lane's write")?;
    drop(lane);
    dev.unpin(word).ctx("unpin")?;
    Ok(format!("lane on queue {queue} of {}", info.queues))
}
