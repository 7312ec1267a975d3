//! Device contexts (ABI 1.5): each open file that is not a lane has its
//! own, a lane uses its owner's, and a kernel's fault ends only the
//! faulting file's context.

use std::time::{Duration, Instant};

use vgpu_guest::{sys, vgpu_abi, Dims, Error};

use super::*;
use crate::{Args, CaseResult};

/// A kernel that stores 42 at the address it is given.
const WILD_PTX: &str = "\
.version 8.0
.target sm_80
.address_size 64

.visible .entry wild(.param .u64 wild_param_0)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<3>;
	ld.param.u64 %rd1, [wild_param_0];
	cvta.to.global.u64 %rd2, %rd1;
	mov.u32 %r1, 42;
	st.global.u32 [%rd2], %r1;
	ret;
}
";

/// Far above anything a GPU or the software backend maps.
const NOWHERE: u64 = 0x7ff0 << 44;

/// The device status of a failed command, if it is one.
fn status_of(e: &Error) -> Option<u32> {
    match e {
        Error::Command { status, .. } => Some(*status),
        _ => None,
    }
}

pub(super) fn contexts(args: &Args) -> CaseResult {
    let a = open(args)?;
    let info = a.cached_info();
    let has = info.flags & sys::INFO_CONTEXTS != 0;
    ensure!(
        has == (info.features & vgpu_abi::FEATURE_CONTEXTS != 0),
        "INFO says contexts {has}, FEATURES {:#x}",
        info.features
    );
    let ua = a.usage().ctx("USAGE")?;
    if !has {
        ensure!(
            info.max_contexts == 0 && ua.context == 0 && ua.contexts == 0,
            "without contexts: max {}, context {}, contexts {}",
            info.max_contexts,
            ua.context,
            ua.contexts
        );
        return Ok("skipped: the device has no contexts; every file is on context 0".into());
    }
    let b = open(args)?;
    let ub = b.usage().ctx("USAGE")?;
    ensure!(
        ua.context != 0 && ub.context != 0 && ua.context != ub.context,
        "two files have contexts {} and {}",
        ua.context,
        ub.context
    );
    let (lane, _) = a.lane().ctx("lane")?;
    let ul = lane.usage().ctx("USAGE of the lane")?;
    ensure!(
        ul.context == ua.context,
        "the lane has context {}, its owner {}",
        ul.context,
        ua.context
    );

    // A's memory (which makes A's context), then B's; B's kernel faults.
    let pattern = rng(71).bytes(64 * KIB as usize);
    let mine = a.alloc(64 * KIB).ctx("alloc")?;
    a.copy_to_device(&mine, 0, &pattern).ctx("copy")?;
    // What a context costs on the host counts in MEM_USED: A's does now.
    let base = a.usage().ctx("USAGE")?;
    let theirs = b.alloc(64 * KIB).ctx("alloc in the other context")?;
    let m = match b.module_load(WILD_PTX.as_bytes()) {
        Ok(m) => m,
        Err(e) if e.errno() == libc::EOPNOTSUPP => {
            return Ok("contexts numbered; this backend runs no loaded modules".into())
        }
        Err(e) => return Err(format!("MODULE_LOAD: {e}")),
    };
    let during = a.usage().ctx("USAGE")?;
    ensure!(
        during.contexts > base.contexts && during.contexts <= info.max_contexts,
        "{} contexts with B's made (before {}, at most {})",
        during.contexts,
        base.contexts,
        info.max_contexts
    );
    let fault = b.launch(&m, "wild", Dims::default(), &NOWHERE.to_le_bytes());
    let status = fault.as_ref().err().and_then(status_of);
    ensure!(
        matches!(
            status,
            Some(sys::CMD_STATUS_KERNEL_FAULT | sys::CMD_STATUS_DEVICE_ERROR)
        ),
        "the wild store gave {:?}",
        fault.map(drop)
    );
    // Every later command of B's context that needs device state. A
    // backend that reports a wild store as a failed launch (DEVICE_ERROR)
    // may keep the context; a KERNEL_FAULT always ends it.
    let r = b.fill(&theirs, 0, 4096, 7);
    let ended = status == Some(sys::CMD_STATUS_KERNEL_FAULT) || r.is_err();
    let mut lost = 0;
    if ended {
        ensure!(
            r.as_ref().err().is_some_and(Error::is_context_lost),
            "a fill after the fault: {r:?}"
        );
        lost += 1;
        let r = b.alloc(4096).map(drop);
        ensure!(
            r.as_ref().err().is_some_and(Error::is_context_lost),
            "an alloc after the fault: {r:?}"
        );
        lost += 1;
        let r = theirs.free();
        ensure!(
            r.as_ref().err().is_some_and(Error::is_context_lost),
            "a free after the fault: {r:?}"
        );
        lost += 1;
    } else {
        theirs
            .free()
            .ctx("free after a kept context's failed launch")?;
    }

    // A goes on: its memory and its work are untouched, nothing reset.
    let mut back = vec![0u8; pattern.len()];
    a.copy_from_device(&mine, 0, &mut back)
        .ctx("copy after the other's fault")?;
    same(&back, &pattern, "memory after the other's fault")?;
    lane.fill_addr(mine.addr(), 4096, 0x0101_0101)
        .ctx("the lane's fill after the other's fault")?;
    let after = a.usage().ctx("USAGE")?;
    ensure!(
        after.recoveries == base.recoveries,
        "the driver reset {} time(s)",
        after.recoveries - base.recoveries
    );

    // Closing B ends its context: MEM_USED and the contexts are back.
    drop(m);
    drop(b);
    let deadline = Instant::now() + Duration::from_secs(5);
    let settled = loop {
        let u = a.usage().ctx("USAGE")?;
        if (u.mem_used == base.mem_used && u.contexts == base.contexts) || Instant::now() > deadline
        {
            break u;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    ensure!(
        settled.mem_used == base.mem_used && settled.contexts == base.contexts,
        "after the close: MEM_USED {} and {} contexts, before {} and {}",
        settled.mem_used,
        settled.contexts,
        base.mem_used,
        base.contexts
    );
    Ok(format!(
        "contexts {} and {}, the lane on its owner's; the fault (status {}) {}, {lost} later commands CONTEXT_LOST; the other file unharmed; memory back at close; {} context(s), at most {}",
        ua.context,
        ub.context,
        status.unwrap_or(0),
        if ended {
            "ended only its own context"
        } else {
            "left the context to the backend (a failed launch)"
        },
        settled.contexts,
        info.max_contexts
    ))
}
