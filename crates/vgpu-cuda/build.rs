//! The CUDA runtime opens the driver as `libcuda.so.1`: give the library
//! that soname, as NVIDIA's has.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
}
