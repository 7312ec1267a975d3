//! `vgpu_ptx::Module::parse` on arbitrary UTF-8 text: it returns a module
//! or an error naming a line of the text, never panics. Every kernel of
//! an accepted module is then launched (one block of 32 threads, small
//! memory, a step limit, a sink for what it prints): the executor ends
//! with a result or an error, never a panic or a hang, and no `printf`
//! call prints more than its limit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_ptx::printf::MAX_OUTPUT;
use vgpu_ptx::{launch, LaunchConfig, Limits, Module, PrintSink, VecMemory};

struct Bounded;

impl PrintSink for Bounded {
    fn print(&self, text: &[u8]) {
        assert!(text.len() <= MAX_OUTPUT, "{} bytes from one printf", text.len());
    }
}

fuzz_target!(|text: &str| {
    let module = match Module::parse(text) {
        Ok(m) => m,
        Err(e) => {
            let lines = text.split('\n').count().max(1) as u32;
            assert!(e.line >= 1 && e.line <= lines, "line {} of {lines}", e.line);
            return;
        }
    };
    let mem = VecMemory::new(0x1000, 4096);
    let limits = Limits {
        max_shared: 48 << 10,
        max_local_per_thread: 4096,
        max_steps: Some(20_000),
        deadline: None,
        cancel: None,
        print: Some(&Bounded),
        statics: None,
        grid_sync: None,
    };
    let cfg = LaunchConfig { grid: [2, 1, 1], block: [32, 1, 1], shared_dyn: 256, workers: 1 };
    for k in module.kernels() {
        // Every pointer parameter points into the memory above.
        let mut params = vec![0u8; k.param_bytes as usize];
        for p in &k.params {
            let v = 0x1000u64.to_le_bytes();
            let n = (p.size as usize).min(8);
            params[p.offset as usize..p.offset as usize + n].copy_from_slice(&v[..n]);
        }
        let _ = launch(&module, &k.name, &cfg, &params, &mem, &limits);
    }
});
