//! What kernels print. The device keeps the `printf` output (and failed
//! `assert()` lines) of each module that calls `vprintf` or
//! `__assertfail` (MODULE_LOAD says which); the library takes it where
//! CUDA's driver flushes its printf buffer (a synchronisation, a blocking
//! copy, a module's unload) and writes it to the program's C `stdout`, so
//! it stays in order with the program's own `printf`, as NVIDIA's driver
//! does.

use std::sync::{Arc, Weak};

use vgpu_guest::{Device, Module};

use crate::diag::log;

/// What one CONSOLE takes at most: a piece of the output.
const PIECE: usize = 64 << 10;

/// The modules of one device whose kernels may print.
#[derive(Default)]
pub struct Console {
    modules: Vec<Weak<Module>>,
}

impl Console {
    /// Watches `module` if its kernels may print.
    pub fn watch(&mut self, module: &Arc<Module>) {
        if module.prints() {
            self.modules.retain(|m| m.strong_count() > 0);
            self.modules.push(Arc::downgrade(module));
        }
    }

    /// Whether any module may have printed.
    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// Writes what the watched modules' kernels printed to `stdout`.
    pub fn print(&mut self, dev: &Device) {
        self.modules.retain(|m| m.strong_count() > 0);
        let live: Vec<Arc<Module>> = self.modules.iter().filter_map(Weak::upgrade).collect();
        for m in live {
            print_module(dev, &m);
        }
    }
}

/// Writes what `module` (one that prints) printed to `stdout`.
fn print_module(dev: &Device, module: &Module) {
    match dev.console(module, PIECE) {
        Ok((text, dropped)) => {
            write_stdout(&text);
            if dropped > 0 {
                log(&format!(
                    "{dropped} bytes of kernel output dropped: the device's buffer was full"
                ));
            }
        }
        Err(e) => log(&format!("kernel output not read: {e}")),
    }
}

/// Writes `text` to the C library's `stdout` and flushes it.
fn write_stdout(text: &[u8]) {
    if text.is_empty() {
        return;
    }
    extern "C" {
        static stdout: *mut libc::FILE;
    }
    // SAFETY: `stdout` is the C library's standard output stream, valid
    // for the life of the process; `fwrite` and `fflush` lock it, and
    // `text` is readable for its length.
    unsafe {
        let f = stdout;
        libc::fwrite(text.as_ptr().cast(), 1, text.len(), f);
        libc::fflush(f);
    }
}
