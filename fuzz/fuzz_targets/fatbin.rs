//! `vgpu_ptx::extract_ptx` on arbitrary bytes (a module image as a guest
//! sends it): it returns PTX texts or an error, never panics, and never
//! allocates more than the entries' bounded declared sizes; the texts it
//! returns are then parsed.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|image: &[u8]| {
    if let Ok(texts) = vgpu_ptx::extract_ptx(image) {
        assert!(!texts.is_empty());
        for t in texts {
            let _ = vgpu_ptx::Module::parse(&t);
        }
    }
});
