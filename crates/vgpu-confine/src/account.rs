//! Accounts: looking users and groups up, and giving the runtime
//! directory and vGPU sockets to them.

use std::ffi::{CStr, CString};
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::Path;

use crate::{sys, ConfineError};

/// An account to run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// User id.
    pub uid: u32,
    /// Primary group id.
    pub gid: u32,
    /// Every group it is in, the primary one included.
    pub groups: Vec<u32>,
}

/// Looks `name` up in the user database (before any filter: this may
/// read files and talk to NSS services).
pub fn lookup_user(name: &str) -> Result<Account, ConfineError> {
    let err = account_error(name);
    let cname = CString::new(name).map_err(|_| err("contains a NUL byte".into()))?;
    let ids = |pw: &libc::passwd| (pw.pw_uid, pw.pw_gid);
    let (uid, gid) = lookup(&cname, "user", libc::getpwnam_r, ids).map_err(&err)?;
    let mut groups = vec![0 as libc::gid_t; 64];
    loop {
        let mut n = groups.len() as libc::c_int;
        // SAFETY: `groups` has room for `n` entries; the call writes at
        // most `n` and sets `n` to the number it needs.
        let rc = unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        let n = usize::try_from(n).unwrap_or(0);
        if rc >= 0 {
            groups.truncate(n);
            break;
        }
        if n <= groups.len() || n > 65536 {
            return Err(err("cannot list its groups".into()));
        }
        groups.resize(n, 0);
    }
    Ok(Account {
        name: name.to_string(),
        uid,
        gid,
        groups,
    })
}

/// Creates the runtime directory for `account` when it is missing: mode
/// 0755 (VMMs must reach the sockets in it; the sockets themselves are
/// 0600), owned by the account so that it can bind sockets there after
/// the switch. An existing directory is left as it is; binding in it then
/// fails clearly if the account may not write there.
pub fn prepare_runtime_dir(dir: &Path, account: &Account) -> Result<(), ConfineError> {
    match fs::symlink_metadata(dir) {
        Ok(m) => {
            if m.uid() != account.uid {
                log::warn!(
                    "runtime directory {} belongs to uid {}, not to {} ({}); \
                     sockets there need it to be writable by {}",
                    dir.display(),
                    m.uid(),
                    account.name,
                    account.uid,
                    account.name
                );
            }
            Ok(())
        }
        Err(_) => {
            let what = || format!("create {}", dir.display());
            // Missing parents as `mkdir -p` would make them under umask
            // 022 (the daemon's own umask is stricter): the user and the
            // VMMs must be able to pass through them.
            let missing: Vec<&Path> = dir
                .ancestors()
                .skip(1)
                .take_while(|p| !p.as_os_str().is_empty() && fs::symlink_metadata(p).is_err())
                .collect();
            for p in missing.into_iter().rev() {
                fs::DirBuilder::new().create(p).map_err(sys(what()))?;
                fs::set_permissions(p, fs::Permissions::from_mode(0o755)).map_err(sys(what()))?;
            }
            fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .map_err(sys(what()))?;
            let c = CString::new(dir.as_os_str().as_encoded_bytes())
                .map_err(|e| sys(what())(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
            lchown(&c, account.uid, account.gid).map_err(sys(format!(
                "give {} to {}",
                dir.display(),
                account.name
            )))?;
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).map_err(sys(what()))
        }
    }
}

/// Looks a group up by name (before any filter, as [`lookup_user`]).
pub fn lookup_group(name: &str) -> Result<u32, ConfineError> {
    let err = account_error(name);
    let cname = CString::new(name).map_err(|_| err("contains a NUL byte".into()))?;
    lookup(&cname, "group", libc::getgrnam_r, |gr| gr.gr_gid).map_err(err)
}

/// The error about account `name` that a message makes.
fn account_error(name: &str) -> impl Fn(String) -> ConfineError + '_ {
    move |message| ConfineError::User {
        name: name.to_string(),
        message,
    }
}

/// The `getpwnam_r` / `getgrnam_r` shape of call.
type LookupFn<T> = unsafe extern "C" fn(
    *const libc::c_char,
    *mut T,
    *mut libc::c_char,
    libc::size_t,
    *mut *mut T,
) -> libc::c_int;

/// Looks `name` up with `call` (`getpwnam_r` for a `passwd`, `getgrnam_r`
/// for a `group`: `T` must be one of these plain C structs), giving the
/// call a larger buffer for the entry's strings while it asks for one;
/// `read` takes what is wanted from the entry. `what` names the kind of
/// entry in the error for a missing one.
fn lookup<T, R>(
    name: &CStr,
    what: &str,
    call: LookupFn<T>,
    read: impl FnOnce(&T) -> R,
) -> Result<R, String> {
    // Group entries list their members: a large group needs room.
    const MAX_BUF: usize = 16 << 20;
    let mut len = 16 << 10;
    loop {
        let mut buf = vec![0 as libc::c_char; len];
        // SAFETY: `T` is `passwd` or `group`, plain data for which all
        // zeros is a valid value; the call fills it in.
        let mut entry: T = unsafe { std::mem::zeroed() };
        let mut found: *mut T = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf` holds the
        // strings `entry` points to and outlives every use of them.
        let rc = unsafe { call(name.as_ptr(), &mut entry, buf.as_mut_ptr(), len, &mut found) };
        match rc {
            0 if found.is_null() => return Err(format!("no such {what}")),
            0 => return Ok(read(&entry)),
            libc::ERANGE if len < MAX_BUF => len *= 4,
            rc => return Err(io::Error::from_raw_os_error(rc).to_string()),
        }
    }
}

/// Whether the process may give files to group `gid` (it is one of its
/// groups), so that [`share_socket`] will work after the switch.
pub fn in_group(gid: u32, account: Option<&Account>) -> bool {
    if let Some(a) = account {
        return a.gid == gid || a.groups.contains(&gid);
    }
    // SAFETY: getegid cannot fail.
    if unsafe { libc::getegid() } == gid {
        return true;
    }
    // SAFETY: with a size of 0, getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0; usize::try_from(n).unwrap_or(0)];
    // SAFETY: `groups` has room for `n` entries.
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(n).unwrap_or(0));
    groups.contains(&gid)
}

/// Gives a vGPU socket to group `gid` with mode 0660, so that VMMs in
/// the group can connect. Its owner keeps it; the mode is set last, so
/// the group never reaches a socket with other permissions than these.
pub fn share_socket(path: &Path, gid: u32) -> Result<(), ConfineError> {
    let what = || format!("give {} to group {gid}", path.display());
    let c = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| sys(what())(io::Error::new(io::ErrorKind::InvalidInput, e)))?;
    lchown(&c, u32::MAX, gid).map_err(sys(what()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o660)).map_err(sys(what()))
}

fn lchown(path: &CStr, uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: `path` is a valid NUL-terminated string.
    if unsafe { libc::lchown(path.as_ptr(), uid, gid) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_runtime_dir_is_made_for_the_user() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            vgpu_testkit::skip("not root (giving a directory to another user needs root)");
            return;
        }
        let nobody = lookup_user("nobody").unwrap();
        let tmp = vmm_sys_util::tempdir::TempDir::new_with_prefix("/tmp/vgpud-rundir-").unwrap();
        let dir = tmp.as_path().join("a/b/run");
        // SAFETY: umask only sets the process's file creation mask.
        let old = unsafe { libc::umask(0o077) };
        let made = prepare_runtime_dir(&dir, &nobody);
        // SAFETY: as above.
        unsafe { libc::umask(old) };
        made.unwrap();
        let m = fs::metadata(&dir).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o777),
            (nobody.uid, nobody.gid, 0o755)
        );
        for p in [tmp.as_path().join("a"), tmp.as_path().join("a/b")] {
            let m = fs::metadata(&p).unwrap();
            assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o755), "{}", p.display());
        }
        // An existing directory is left as it is.
        prepare_runtime_dir(tmp.as_path(), &nobody).unwrap();
        assert_eq!(fs::metadata(tmp.as_path()).unwrap().uid(), 0);
    }

    #[test]
    fn test_lookup_user() {
        let root = lookup_user("root").unwrap();
        assert_eq!((root.uid, root.gid), (0, 0));
        assert!(root.groups.contains(&0));
        let e = lookup_user("no-such-user-vgpud").unwrap_err().to_string();
        assert!(e.contains("no such user"), "{e}");
        assert!(lookup_user("a\0b").is_err());
    }

    #[test]
    fn test_lookup_group() {
        assert_eq!(lookup_group("root").unwrap(), 0);
        let e = lookup_group("no-such-group-vgpud").unwrap_err().to_string();
        assert!(e.contains("no such group"), "{e}");
        assert!(lookup_group("a\0b").is_err());
    }
}
