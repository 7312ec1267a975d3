//! The privilege drop: switching every thread to an account for good,
//! clearing capabilities, and checking that nothing remains.

use std::fs;
use std::io;

use crate::{sys, Account, ConfineError};

/// The real, effective and saved user ids.
fn resuid() -> (u32, u32, u32) {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: the pointers are valid for the call.
    unsafe { libc::getresuid(&mut r, &mut e, &mut s) };
    (r, e, s)
}

/// Whether the process runs as root (any of its user ids is 0).
pub fn is_root() -> bool {
    let (r, e, s) = resuid();
    r == 0 || e == 0 || s == 0
}

/// Switches every thread to `account` for good: supplementary groups,
/// then group ids, then user ids (in that order: the group calls need
/// root), which empties the permitted and effective capability sets.
/// Then checks that root cannot be regained and that no thread holds a
/// capability. The C library applies each call to all threads.
pub fn drop_privileges(account: &Account) -> Result<(), ConfineError> {
    let check = |rc: libc::c_int, what: &str| {
        if rc == 0 {
            Ok(())
        } else {
            Err(sys(what.to_string())(io::Error::last_os_error()))
        }
    };
    let (uid, gid) = (account.uid, account.gid);
    // SAFETY: the pointer and length describe `account.groups`.
    let rc = unsafe { libc::setgroups(account.groups.len(), account.groups.as_ptr()) };
    check(rc, "set supplementary groups")?;
    // SAFETY: plain system calls on ids.
    check(unsafe { libc::setresgid(gid, gid, gid) }, "set group ids")?;
    // SAFETY: as above.
    check(unsafe { libc::setresuid(uid, uid, uid) }, "set user ids")?;
    clear_capabilities()?;
    if uid != 0 {
        // SAFETY: as above; expected to fail.
        if unsafe { libc::setresuid(0, 0, 0) } == 0 {
            return Err(ConfineError::Remains("root could be regained".into()));
        }
    }
    verify_dropped(uid, gid)
}

/// Empties the calling thread's capability sets (permitted, effective,
/// inheritable, ambient). A process that is not root may still have been
/// given some (file capabilities, a service manager).
pub fn clear_capabilities() -> Result<(), ConfineError> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data are the layouts capset(2) takes (version 3:
    // two data entries); the kernel only reads them.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if rc != 0 {
        return Err(sys("clear capabilities")(io::Error::last_os_error()));
    }
    // SAFETY: prctl with these arguments only changes the ambient set.
    let rc = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    };
    // EINVAL: a kernel without ambient capabilities has none to clear.
    if rc != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINVAL) {
        return Err(sys("clear ambient capabilities")(io::Error::last_os_error()));
    }
    Ok(())
}

/// Reads every thread's ids and capability sets from /proc and checks
/// that all are `uid`/`gid` and empty.
fn verify_dropped(uid: u32, gid: u32) -> Result<(), ConfineError> {
    let tasks = fs::read_dir("/proc/self/task").map_err(sys("list threads"))?;
    for t in tasks {
        let t = t.map_err(sys("list threads"))?;
        let path = t.path().join("status");
        let status = match fs::read_to_string(&path) {
            Ok(s) => s,
            // A thread that ended meanwhile.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(sys(format!("read {}", path.display()))(e)),
        };
        let problem = status_problem(&status, uid, gid);
        if let Some(p) = problem {
            return Err(ConfineError::Remains(format!(
                "thread {}: {p}",
                t.file_name().to_string_lossy()
            )));
        }
    }
    Ok(())
}

/// What in a /proc status text says privileges remain, if anything.
fn status_problem(status: &str, uid: u32, gid: u32) -> Option<String> {
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match key {
            "Uid" | "Gid" => {
                let want = if key == "Uid" { uid } else { gid };
                if value.split_whitespace().any(|v| v.parse() != Ok(want)) {
                    return Some(format!("{key} is {value}"));
                }
            }
            "CapPrm" | "CapEff" | "CapAmb" if u64::from_str_radix(value, 16) != Ok(0) => {
                return Some(format!("{key} is {value}"));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_status_problems() {
        let ok = "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGid:\t65534\t65534\t65534\t65534\n\
                  CapInh:\t0000000000000000\nCapPrm:\t0000000000000000\n\
                  CapEff:\t0000000000000000\nCapBnd:\t000001ffffffffff\nCapAmb:\t0000000000000000\n";
        assert_eq!(status_problem(ok, 65534, 65534), None);
        let root = ok.replace("Uid:\t65534\t65534\t65534", "Uid:\t65534\t0\t65534");
        assert!(status_problem(&root, 65534, 65534).unwrap().contains("Uid"));
        let caps = ok.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000000400");
        assert!(status_problem(&caps, 65534, 65534)
            .unwrap()
            .contains("CapEff"));
        assert!(status_problem(ok, 1, 65534).is_some());
    }
}
