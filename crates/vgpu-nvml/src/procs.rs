//! The processes that have a vGPU open, found as `fuser` finds them:
//! through the open files each process lists under `/proc/PID/fd`.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

/// What identifies the device's files: its path, and its device number
/// (for a process that opened it through another path or mount).
pub struct Target<'a> {
    pub path: &'a Path,
    pub rdev: u64,
}

impl Target<'_> {
    /// Whether the open file `fd` (a `/proc/PID/fd/N` link) is the device.
    fn matches(&self, fd: &Path) -> bool {
        let Ok(dest) = fs::read_link(fd) else {
            return false;
        };
        if dest == self.path {
            return true;
        }
        // Only device nodes can be the device; `stat` nothing else
        // (sockets, pipes, regular files).
        dest.starts_with("/dev/")
            && fs::metadata(fd)
                .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == self.rdev)
    }
}

/// The processes under `proc_root` (`/proc`) with `target` open, by pid,
/// each once. `skip` is one open file not to count, this library's own
/// (pid, fd). Processes whose files cannot be read (another user's,
/// without privilege, or gone meanwhile) are left out.
pub fn holders(proc_root: &Path, target: &Target<'_>, skip: Option<(u32, i32)>) -> Vec<u32> {
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let Ok(fds) = fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
                return false;
            };
            fds.flatten().any(|fd| {
                let n = fd.file_name().to_str().and_then(|n| n.parse::<i32>().ok());
                match n {
                    Some(n) if skip == Some((pid, n)) => false,
                    Some(_) => target.matches(&fd.path()),
                    None => false,
                }
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// `nvmlSystemGetProcessName`'s name of `pid`: its command line's first
/// word, or its `comm` for a kernel thread or a process that cleared it.
pub fn name(proc_root: &Path, pid: u32) -> Option<String> {
    let dir = proc_root.join(pid.to_string());
    if let Ok(cmdline) = fs::read(dir.join("cmdline")) {
        let first = cmdline.split(|&b| b == 0).next().unwrap_or_default();
        if !first.is_empty() {
            return Some(String::from_utf8_lossy(first).into_owned());
        }
    }
    let comm = fs::read_to_string(dir.join("comm")).ok()?;
    Some(comm.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::PathBuf;

    use super::*;

    /// A fresh folder for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vgpu-nvml-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn open_file(root: &Path, pid: u32, fd: i32, dest: &str) {
        let dir = root.join(pid.to_string()).join("fd");
        fs::create_dir_all(&dir).unwrap();
        symlink(dest, dir.join(fd.to_string())).unwrap();
    }

    #[test]
    fn holders_are_the_processes_with_the_device_open() {
        let root = scratch("holders");
        open_file(&root, 300, 0, "/dev/null");
        open_file(&root, 300, 3, "/dev/vgpu0");
        open_file(&root, 300, 4, "/dev/vgpu0");
        open_file(&root, 20, 5, "/dev/vgpu0");
        open_file(&root, 21, 3, "/dev/vgpu1");
        open_file(&root, 22, 3, "socket:[1234]");
        // This library's own file is skipped; a second one counts.
        open_file(&root, 40, 7, "/dev/vgpu0");
        open_file(&root, 41, 7, "/dev/vgpu0");
        open_file(&root, 41, 8, "/dev/vgpu0");
        // A process whose fd folder is gone, and entries that are no pid.
        fs::create_dir_all(root.join("50")).unwrap();
        fs::create_dir_all(root.join("sys")).unwrap();
        symlink("300", root.join("self")).unwrap();

        let target = Target {
            path: Path::new("/dev/vgpu0"),
            rdev: u64::MAX,
        };
        assert_eq!(holders(&root, &target, Some((40, 7))), vec![20, 41, 300]);
        assert_eq!(
            holders(&root, &target, Some((41, 7))),
            vec![20, 40, 41, 300]
        );
        let other = Target {
            path: Path::new("/dev/vgpu1"),
            rdev: u64::MAX,
        };
        assert_eq!(holders(&root, &other, None), vec![21]);
        assert!(holders(&root.join("missing"), &target, None).is_empty());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_device_opened_through_another_path_is_found_by_its_number() {
        let root = scratch("rdev");
        open_file(&root, 7, 3, "/dev/null");
        let rdev = fs::metadata("/dev/null").unwrap().rdev();
        let target = Target {
            path: Path::new("/dev/vgpu9"),
            rdev,
        };
        assert_eq!(holders(&root, &target, None), vec![7]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_come_from_the_command_line_or_comm() {
        let root = scratch("names");
        fs::create_dir_all(root.join("5")).unwrap();
        fs::write(root.join("5/cmdline"), b"/usr/bin/python3\0train.py\0").unwrap();
        fs::create_dir_all(root.join("6")).unwrap();
        fs::write(root.join("6/cmdline"), b"").unwrap();
        fs::write(root.join("6/comm"), "kworker/0:1\n").unwrap();
        assert_eq!(name(&root, 5).as_deref(), Some("/usr/bin/python3"));
        assert_eq!(name(&root, 6).as_deref(), Some("kworker/0:1"));
        assert_eq!(name(&root, 7), None);
        fs::remove_dir_all(&root).unwrap();
    }
}
