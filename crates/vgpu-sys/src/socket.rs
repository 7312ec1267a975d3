//! Paths of UNIX sockets that a process that died may have left behind.

use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::Path;

/// What is at a path where a socket is to be bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketPath {
    /// Nothing (or nothing this process can see).
    Absent,
    /// A socket no one listens on: left by a process that died.
    Stale,
    /// A socket someone listens on.
    Live,
    /// Something that is not a socket.
    NotSocket,
}

/// Looks at `path` (without following a link), connecting to a socket
/// there to tell a live one from a stale one.
pub fn probe(path: &Path) -> SocketPath {
    match fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => SocketPath::NotSocket,
        Ok(_) if UnixStream::connect(path).is_ok() => SocketPath::Live,
        Ok(_) => SocketPath::Stale,
        Err(_) => SocketPath::Absent,
    }
}

/// Why [`clear_stale`] left a path alone.
#[derive(Debug)]
pub enum ClearError {
    /// A live socket is there.
    InUse,
    /// Something that is not a socket is there.
    NotSocket,
    /// The stale socket could not be removed.
    Remove(io::Error),
}

/// Removes a stale socket at `path`; refuses to touch a live one or
/// anything that is not a socket. Nothing there is fine.
pub fn clear_stale(path: &Path) -> Result<(), ClearError> {
    match probe(path) {
        SocketPath::Absent => Ok(()),
        SocketPath::Stale => fs::remove_file(path).map_err(ClearError::Remove),
        SocketPath::Live => Err(ClearError::InUse),
        SocketPath::NotSocket => Err(ClearError::NotSocket),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn test_only_stale_sockets_are_removed() {
        let dir = std::env::temp_dir().join(format!("vgpu-sys-socket-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir(&dir).unwrap();
        let p = dir.join("s");
        assert_eq!(probe(&p), SocketPath::Absent);
        assert!(clear_stale(&p).is_ok());
        let l = UnixListener::bind(&p).unwrap();
        assert_eq!(probe(&p), SocketPath::Live);
        assert!(matches!(clear_stale(&p), Err(ClearError::InUse)));
        drop(l);
        assert_eq!(probe(&p), SocketPath::Stale);
        clear_stale(&p).unwrap();
        assert_eq!(probe(&p), SocketPath::Absent);
        fs::write(&p, b"x").unwrap();
        assert!(matches!(clear_stale(&p), Err(ClearError::NotSocket)));
        assert!(p.exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
