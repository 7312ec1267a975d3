//! Programs open NVML as `libnvidia-ml.so.1`: give the library that
//! soname, as NVIDIA's has.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
