//! Compiles `proto/greeter.proto` with protox, a protobuf compiler in Rust, so building the
//! example needs no `protoc` on the machine.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let descriptors = protox::compile(["proto/greeter.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    println!("cargo:rerun-if-changed=proto");
    Ok(())
}
