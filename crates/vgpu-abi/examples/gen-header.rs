//! Writes guest-driver/include/vgpu_abi.h from the Rust definitions.

fn main() -> std::io::Result<()> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../guest-driver/include/vgpu_abi.h");
    std::fs::write(&path, vgpu_abi::c_header())?;
    println!("wrote {}", path.display());
    Ok(())
}
