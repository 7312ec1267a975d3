//! What the daemon's integration tests share.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use vgpu_testkit::{Guest, GuestOptions, Mode};

/// A guest on `socket` running FILLs of `bytes` until `stop`, checking
/// every completion and counting them in `done`.
pub fn busy_guest(
    socket: PathBuf,
    bytes: u64,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut g = Guest::connect(&socket, GuestOptions::default());
        g.setup_queue(0, 64, Mode::Interrupt);
        let buf = g.device_alloc(0, bytes);
        let mut pattern = 0u32;
        while !stop.load(Ordering::Relaxed) {
            pattern = pattern.wrapping_add(1);
            let c = g.fill(0, buf, bytes, pattern);
            assert_eq!(c.status, vgpu_testkit::abi::STATUS_OK, "FILL {pattern}");
            done.fetch_add(1, Ordering::Relaxed);
        }
        // The work really happened.
        assert_eq!(g.download(0, buf + 1024, 4), pattern.to_le_bytes().to_vec());
    })
}
